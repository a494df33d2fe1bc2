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
