"""The background compile stops while the server it compiles for is busy, and goes on when it is idle.

:mod:`omni_platform.compile_ahead` serves a first start eager while a background process compiles the same
configuration for later starts. That process runs at nice 19 under ``SCHED_IDLE``, yet on a 2-core machine a
first ``make demo`` decoded SmolLM2 at 37.3 tok/s (once 2.8 tok/s) during the compile against 70.9-76.1 tok/s
eager without it (single demo runs, 2026-12-07): the scheduling class keeps it off a core only while a server
thread is runnable, and an eager decode step leaves gaps (the front end's Python, OpenMP threads that sleep
between steps) where the compile's threads and compilers run and take the caches and memory bandwidth the
next step needs.

:func:`start` runs a daemon thread in the ``omni-vllm serve`` front end that samples the CPU time of the
server's own process tree (the front end and everything it started, minus the compile's session) every
``PERIOD_S``: above ``BUSY_CORES`` cores the compile's process group is sent ``SIGSTOP``; after ``IDLE_S``
below it, ``SIGCONT``. It also stops the compile while the server itself starts (loading weights, warming up),
so the first answer comes sooner. The compile finishes later when the server is busy; it is never lost:

* the front end sends ``SIGCONT`` when it exits normally (``atexit``);
* the compile process asks the kernel for ``SIGCONT`` when the front end dies any other way
  (``PR_SET_PDEATHSIG``, man 2 prctl: sent when the parent *thread* exits; the front end starts it from
  its main thread), and on ``SIGCONT`` passes it to its whole process group (:func:`resume_group_on_sigcont`),
  so its engine core and compiler workers resume too.

A server started while an earlier start's compile of the same configuration still runs (stopped and started
again during its first compile) *adopts* it (:func:`start` with ``adopted=True``): that compile's
``PR_SET_PDEATHSIG`` names the earlier front end, so the adopting one first starts a guardian, a small
interpreter of its own whose parent-death signal is ``SIGTERM`` and which then continues the compile's group
(:data:`GUARDIAN`). While busy the yielder sends ``SIGSTOP`` at every sample, so a ``SIGCONT`` from another
server of the same compile does not let it run beside this one's work.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

__all__ = ["BUSY_CORES", "GUARDIAN", "IDLE_S", "PERIOD_S", "Yielder", "continue_when_parent_dies",
           "resume_group_on_sigcont", "start", "start_guardian"]

logger = logging.getLogger("vllm.omni_platform.compile_yield")

PERIOD_S = 0.1
"""Seconds between samples of the server tree's CPU time."""
BUSY_CORES = 0.25
"""The server is busy when its tree used more than this many cores over the last sample (an idle vLLM server,
answering /health, stays well below: its engine core blocks on its input queue)."""
IDLE_S = 1.0
"""Seconds the server must stay below ``BUSY_CORES`` before the compile goes on."""


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


class Yielder:
    """Stops process group ``pgid`` (the compile's session leader's pid) while the tree of process ``root``
    (default: this one) minus that group is busy. :meth:`step` takes one sample (``now`` in s, monotonic);
    :meth:`run` loops until the group is gone. ``stops`` counts the SIGSTOPs sent."""

    def __init__(self, pgid: int, root: int | None = None, *, busy_cores: float = BUSY_CORES,
                 idle_s: float = IDLE_S) -> None:
        self.pgid, self.busy_cores, self.idle_s = pgid, busy_cores, idle_s
        self.root = psutil.Process(root if root is not None else os.getpid())
        self.stopped = False
        self.stops = 0
        self._last: tuple[float, float] | None = None
        self._busy_at = 0.0

    def _tree_cpu_s(self) -> float:
        total = 0.0
        for p in [self.root, *self.root.children(recursive=True)]:
            try:
                if p.pid != self.root.pid and os.getpgid(p.pid) == self.pgid:
                    continue
                t = p.cpu_times()
                total += t.user + t.system
            except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
                continue
        return total

    def step(self, now: float) -> bool:
        """One sample; returns False once the group is gone (nothing left to stop)."""
        cpu = self._tree_cpu_s()
        last, self._last = self._last, (now, cpu)
        if last is None or now <= last[0]:
            return True
        cores = (cpu - last[1]) / (now - last[0])
        if cores > self.busy_cores:
            self._busy_at = now
            if not _signal_group(self.pgid, signal.SIGSTOP):  # every busy sample: another server may continue it
                return False
            if not self.stopped:
                self.stopped, self.stops = True, self.stops + 1
                if self.stops == 1:
                    logger.info("omni: the background compile (process group %d) stops while this server is busy "
                                "and goes on after %.1f s idle", self.pgid, self.idle_s)
        elif self.stopped and now - self._busy_at >= self.idle_s:
            if not _signal_group(self.pgid, signal.SIGCONT):
                return False
            self.stopped = False
        return True

    def release(self) -> None:
        """Let the group run (``SIGCONT``); harmless when it is gone or already running."""
        _signal_group(self.pgid, signal.SIGCONT)
        self.stopped = False

    def run(self, period_s: float = PERIOD_S) -> None:
        """Sample every ``period_s`` seconds until the group has exited."""
        try:
            while self.step(time.monotonic()):
                time.sleep(period_s)
                try:
                    os.killpg(self.pgid, 0)
                except ProcessLookupError:
                    return
        finally:
            self.release()


GUARDIAN = """
import os, signal, sys, time
pgid, parent = int(sys.argv[1]), int(sys.argv[2])
def go_on(*_):
    try:
        os.killpg(pgid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, go_on)
while True:
    if os.getppid() != parent:
        go_on()
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        os._exit(0)
    time.sleep(1.0)
"""
"""The guardian's program: on ``SIGTERM`` (its parent-death signal), when its parent is gone (checked every
second: the death may come before ``prctl`` took effect), ``SIGCONT`` to the group and exit; exit when the group
is gone."""


def _term_when_parent_dies() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_guardian(pgid: int) -> subprocess.Popen:
    """Start :data:`GUARDIAN` for process group ``pgid`` as a child of this (main) thread. Returns the process."""
    return subprocess.Popen([sys.executable, "-S", "-I", "-c", GUARDIAN, str(pgid), str(os.getpid())],
                            stdin=subprocess.DEVNULL, preexec_fn=_term_when_parent_dies, close_fds=True)


def start(pgid: int, *, adopted: bool = False) -> Yielder:
    """Start the daemon thread for the compile whose session leader is ``pgid``; ``SIGCONT`` at exit.
    ``adopted``: another front end started it (its parent-death signal is not this process's): a guardian is
    started first (:func:`start_guardian`). Call from the main thread (``PR_SET_PDEATHSIG`` follows the thread)."""
    if adopted:
        start_guardian(pgid)
    y = Yielder(pgid)
    atexit.register(y.release)
    threading.Thread(target=y.run, name="omni-compile-yield", daemon=True).start()
    return y


def continue_when_parent_dies() -> None:
    """For ``preexec_fn``: ``PR_SET_PDEATHSIG`` = ``SIGCONT`` (Linux; silently nothing elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGCONT), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def resume_group_on_sigcont() -> None:
    """In the compile process: on ``SIGCONT`` (from the front end, or the kernel when it died), continue the
    whole process group as well: a stopped group stays stopped unless each member gets ``SIGCONT``."""
    def handler(_sig, _frame) -> None:
        signal.signal(signal.SIGCONT, signal.SIG_IGN)  # the copy sent to this process is dropped, not looped on
        try:
            _signal_group(os.getpgid(0), signal.SIGCONT)
        finally:
            signal.signal(signal.SIGCONT, handler)

    signal.signal(signal.SIGCONT, handler)
