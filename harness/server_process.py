"""A server as a child process, the one handle every part of the harness starts servers with: a free loopback
port, the launch time, readiness on ``/health``, its log, stopping its whole process group; and the HTTP calls
the arms make to it (a JSON POST, a streamed POST's arrival times).

Used by the demo (``harness/demo.py``), the server arms (``harness/arms/server.py``, ``llama_server.py``), the
start-up profile (``harness/startup``), the load runs, the soak and the paired benchmark (``harness/load/servers.py``).
The server runs in a session of its own (``start_new_session=True``), so stopping it stops the engine core it
spawned too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Server", "concurrent_seconds", "free_port", "log_tail", "post_json", "stop_group", "stream_times",
           "wait_healthy"]

HEALTH_POLL_S = 0.05
"""Seconds between two ``/health`` polls while a server starts (a start's end is read to this resolution)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict, timeout_s: float = 1800.0) -> dict:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer.

    Raises:
        urllib.error.URLError / urllib.error.HTTPError: no answer, or a status other than 2xx.
        TimeoutError: no answer within ``timeout_s`` seconds.
    """
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of ``path``, or ``"(no log)"``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stream_times(url: str, body: dict, timeout_s: float = 1800.0,
                 text: Callable[[dict], Any] | None = None) -> tuple[list[float], dict | None]:
    """POST ``body`` with ``"stream": true`` to ``url`` and read the server-sent events (``data: {...}`` lines).

    Returns the arrival time (``time.perf_counter()``) of every event that carries generated text, and the last
    ``usage`` object seen (None when none came). ``text(event)``: the event's generated text; default OpenAI's
    ``choices[0].text`` or ``choices[0].delta.content``, and llama-server's native ``content``.

    Raises:
        urllib.error.URLError / urllib.error.HTTPError: no answer, or a status other than 2xx.
    """
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    times: list[float] = []
    usage = None
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if (text or _event_text)(event):
                times.append(time.perf_counter())
            if event.get("usage"):
                usage = event["usage"]
    return times, usage


def concurrent_seconds(one: Callable[[int], None], n: int) -> float:
    """Run ``one(0) .. one(n - 1)`` at once, a thread each (the streams of an aggregate decode measurement), and
    return the wall seconds until the last ended.

    Raises:
        BaseException: the first exception a call raised, after every thread ended.
    """
    import threading

    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            one(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - t
    if errors:
        raise errors[0]
    return seconds


def _event_text(event: dict) -> Any:
    choices = event.get("choices")
    if choices:
        first = choices[0]
        return first.get("text") or (first.get("delta") or {}).get("content")
    return event.get("content")


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, log: Path, poll_s: float = 0.2,
                 each_poll: Callable[[], None] | None = None) -> float:
    """Poll ``url`` (``/health``) every ``poll_s`` seconds until it answers 200; return ``time.monotonic()`` then.
    ``each_poll()`` runs before every poll (the start-up profile reads the new processes' create times).

    Raises:
        RuntimeError: the server exited first, or was not healthy within ``timeout_s`` seconds;
            the message carries the last lines of ``log``.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if each_poll is not None:
            each_poll()
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited with status {proc.returncode} before it was ready; "
                f"last lines of {log}:\n{log_tail(log)}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s; see {log}:\n{log_tail(log)}")


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop the server (or any child started with ``start_new_session=True``) and every process of its group:
    SIGTERM to the server alone first, so that it
    shuts down the engine core it spawned (vLLM's own shutdown path; a SIGTERM to the whole group at
    once killed the engine core under a live front end, whose log then ended in ``EngineDeadError``),
    then SIGTERM and, after ``grace_s`` seconds, SIGKILL to whatever of the group is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not _group_alive(proc):
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # emptied since the check
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(proc):
            time.sleep(0.1)
    proc.wait()


def _group_alive(proc: subprocess.Popen) -> bool:
    """Whether any process of ``proc``'s group is left (``proc`` reaped first: a zombie leader counts)."""
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Server:
    """A started server.

    ``proc``: its process, the leader of its own session; ``base``: ``http://127.0.0.1:PORT``; ``command``: what
    ran; ``log``: its stdout and stderr; ``launched``: ``time.perf_counter()`` just before the process was created
    (a start's clock), ``launched_unix`` the wall clock then; ``healthy_unix``: the wall clock (``time.time()``)
    when ``/health`` first answered 200, None until then. Use as a context manager, or call :meth:`stop`."""

    proc: subprocess.Popen
    port: int
    command: list[str]
    log: Path
    launched: float
    launched_unix: float
    healthy_unix: float | None = field(default=None)

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, command: Callable[[int], Sequence[str]] | Sequence[str], log: Path, *,
              env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout_s: float | None = 900.0,
              poll_s: float = HEALTH_POLL_S) -> Server:
        """Start a server on a free loopback port and, unless ``timeout_s`` is None, wait for ``/health``.

        ``command``: the command line, or a function of the port that returns it; ``log``: the file its output
        goes to (its folder is made); ``env``: its whole environment (default this process's); ``cwd``: its working
        directory (default this process's).

        Raises:
            RuntimeError: the server exited or was not healthy within ``timeout_s`` s (the log's tail attached);
                it is stopped first.
            OSError: the command could not be started.
        """
        port = free_port()
        cmd = [str(c) for c in (command(port) if callable(command) else command)]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as f:
            launched, launched_unix = time.perf_counter(), time.time()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(env) if env is not None else None, cwd=cwd)
        server = cls(proc, port, cmd, log, launched, launched_unix)
        if timeout_s is not None:
            try:
                server.wait_healthy(timeout_s, poll_s)
            except BaseException:
                server.stop()
                raise
        return server

    def wait_healthy(self, timeout_s: float, poll_s: float = HEALTH_POLL_S,
                     each_poll: Callable[[], None] | None = None) -> float:
        """Wait until ``/health`` answers 200 (see :func:`wait_healthy`); return ``time.monotonic()`` then.

        Raises:
            RuntimeError: the server exited first, or was not healthy within ``timeout_s`` seconds.
        """
        ready = wait_healthy(self.proc, self.base + "/health", timeout_s, self.log, poll_s, each_poll)
        self.healthy_unix = time.time()
        return ready

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the server and its whole process group (:func:`stop_group`)."""
        stop_group(self.proc, grace_s)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
