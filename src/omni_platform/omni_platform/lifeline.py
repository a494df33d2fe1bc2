"""No orphans: a process vLLM spawned exits when the process that spawned it dies.

vLLM 0.28 on CPU starts the engine core and the workers with ``multiprocessing`` (spawn).
When the front end (``omni-vllm serve``, or a script running ``vllm.LLM``) gets SIGTERM, vLLM
shuts them down; when it is killed with SIGKILL (an OOM killer, a container runtime, a
supervisor), nothing tells them, and they keep their memory and spin on the cores a restart
needs (C13, docs/cases.md).

:func:`watch_parent` runs in every process omni's general plugin loads into that has a
``multiprocessing`` parent: a daemon thread compares ``os.getppid()`` with the parent seen at
start every ``PERIOD_S`` seconds (a re-parented process has a new parent: init or a subreaper).
When the parent is gone it sends itself SIGTERM, so that vLLM's own handlers run (shared memory
segments, sockets), and SIGKILL ``GRACE_S`` seconds later if it is still alive. A chain
(server -> engine core -> worker) unwinds one link per period. A polling thread, not
``PR_SET_PDEATHSIG``: the kernel sends that signal when the parent *thread* exits, so an
``LLM`` built in a short-lived thread would lose its engine with the thread.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time

logger = logging.getLogger("vllm.omni_platform.lifeline")

__all__ = ["GRACE_S", "PERIOD_S", "watch_parent"]

PERIOD_S = 1.0
GRACE_S = 5.0
_started = False
_hooked = False


def _watch(parent: int, period_s: float, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(period_s)
    logger.warning("omni: parent process %d is gone; process %d exits (no orphans)", parent, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os.kill(os.getpid(), signal.SIGKILL)


class _ForkHook:
    """The object ``multiprocessing.util.register_after_fork`` keys the hook by (held for the process's life)."""


_FORK_HOOK = _ForkHook()


def _after_fork(_: object) -> None:
    global _started
    _started = False  # the parent's thread did not survive the fork
    watch_parent()


def watch_parent(period_s: float = PERIOD_S, grace_s: float = GRACE_S) -> bool:
    """Start the watchdog once in this process if it is a ``multiprocessing`` child, and in every child
    ``multiprocessing`` forks from it later.

    A forked child does not load omni's plugins again (they are already imported), so the watchdog
    is registered with ``multiprocessing.util.register_after_fork``: ``BaseProcess._bootstrap`` runs
    it in the child after setting its parent process (CPython 3.11 ``multiprocessing/process.py``).
    OmniPlatform forks the server's engine core by default (``OMNI_ENGINE_CORE_FORK``).

    Returns:
        True when a watchdog runs in this process (started now or before), False for a process
        that multiprocessing did not start (the front end: the user's own process).
    """
    global _started, _hooked
    if _started:
        return True
    if not _hooked:
        multiprocessing.util.register_after_fork(_FORK_HOOK, _after_fork)
        _hooked = True
    if multiprocessing.parent_process() is None:
        return False
    parent = os.getppid()
    if parent == 1:  # the parent died before we got here
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=_watch, args=(parent, period_s, grace_s), name="omni-lifeline", daemon=True).start()
    _started = True
    return True
