"""harness.server_process.stop_group: the server is asked first and stops its own children; whatever
of its process group is left gets SIGTERM, then SIGKILL (no vLLM here: two small Python processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from harness.server_process import stop_group

# A "server" that spawns a child in its own process group and, on SIGTERM, stops that child itself,
# like vLLM's front end shutting down its engine core; each records the signals that reach it.
CHILD = """
import signal, sys, time
log, stubborn = sys.argv[1], sys.argv[2] == "1"
def on_term(*_):
    open(log, "a").write("child got SIGTERM\\n")
    if not stubborn:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(log, "a").write("child ready\\n")
while True:
    time.sleep(0.05)
"""
PARENT = """
import signal, subprocess, sys, time
child_py, log, stubborn = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
child = subprocess.Popen([sys.executable, child_py, log, sys.argv[3]])
def on_term(*_):
    open(log, "a").write("parent got SIGTERM\\n")
    if stubborn:
        return
    child.terminate()
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    time.sleep(0.05)
"""


def _start(tmp_path, stubborn: bool) -> tuple[subprocess.Popen, Path]:
    log, child, parent = tmp_path / "log", tmp_path / "child.py", tmp_path / "parent.py"
    child.write_text(CHILD)
    parent.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(parent), str(child), str(log), "1" if stubborn else "0"],
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while "child ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc, log


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_server_is_asked_first_and_stops_its_own_child(tmp_path):
    proc, log = _start(tmp_path, stubborn=False)
    stop_group(proc, grace_s=10)
    lines = log.read_text().splitlines()
    # the parent heard first, and the child's SIGTERM came from the parent (once), not from a group signal
    assert lines == ["child ready", "parent got SIGTERM", "child got SIGTERM"], lines
    assert proc.returncode == 0 and _group_gone(proc.pid)


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    proc, log = _start(tmp_path, stubborn=True)
    t = time.monotonic()
    stop_group(proc, grace_s=1)
    assert time.monotonic() - t < 20
    assert proc.returncode == -9 and _group_gone(proc.pid)
    text = log.read_text()
    assert "parent got SIGTERM" in text and "child got SIGTERM" in text  # the group signal reached both


def _stub(port: int) -> list[str]:
    return [sys.executable, "-m", "harness.paired.stub_server", "--port", str(port), "--token-ms", "1"]


def test_the_server_handle_starts_waits_streams_and_stops(tmp_path):
    """:class:`Server`: a free port, the launch clock before the process exists, ``/health`` waited for, a streamed
    request's arrival times and usage, the group stopped on leaving the ``with``."""
    from harness.server_process import Server, post_json, stream_times

    t0 = time.perf_counter()
    with Server.start(_stub, tmp_path / "stub.log", timeout_s=60) as server:
        assert t0 <= server.launched < time.perf_counter() and server.healthy_unix is not None
        assert server.base == f"http://127.0.0.1:{server.port}" and server.command[-3:] == [str(server.port),
                                                                                          "--token-ms", "1"]
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        times, usage = stream_times(server.base + "/v1/chat/completions", body)
        assert len(times) == 5 and times == sorted(times) and usage["completion_tokens"] == 5
        assert post_json(server.base + "/v1/chat/completions", body)["usage"]["completion_tokens"] == 5
        pgid = server.proc.pid
    assert server.proc.returncode is not None and _group_gone(pgid)


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    import pytest

    from harness.server_process import Server

    with pytest.raises(RuntimeError, match="exited with status 3") as e:
        Server.start([sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"], tmp_path / "x.log",
                     timeout_s=30)
    assert "bad flag --x" in str(e.value)  # the log's tail names the cause
