"""A vLLM OpenAI server as a child process: a free loopback port, readiness, stopping its group.

Shared by the demo (``harness/demo.py``) and the server arms of the benchmark
(``harness/arms/server.py``). The server runs in a session of its own
(``start_new_session=True``), so stopping it stops the engine core it spawned too.
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
from pathlib import Path

__all__ = ["free_port", "log_tail", "post_json", "stop_group", "wait_healthy"]


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


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, log: Path) -> float:
    """Poll ``url`` (``/health``) until it answers 200; return ``time.monotonic()`` then.

    Raises:
        RuntimeError: the server exited first, or was not healthy within ``timeout_s`` seconds;
            the message carries the last lines of ``log``.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
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
        time.sleep(0.2)
    raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s; see {log}:\n{log_tail(log)}")


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop the server and every process of its group: SIGTERM to the server alone first, so that it
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
