"""The peak memory of a process tree during start-up, sampled.

Each process's ``VmHWM`` (``/proc/PID/status``) is its own resident peak, anonymous and file pages
together, but the processes of a tree peak at different moments (vLLM's front end imports while its
worker loads weights), so the sum of their ``VmHWM`` is an upper bound, not the tree's peak. A
:class:`TreePeak` samples the tree's summed RssAnon and RssAnon + RssFile + RssShmem every
``interval_s`` from its start to its stop, and reports the largest sums as ``peak_anon_tree_mb`` and
``peak_total_tree_mb``. A peak shorter than the interval can be missed: the figures are lower
bounds, and ``VmHWM`` per process is kept beside them (:meth:`TreePeak.hwm`) as the upper one.
"""

from __future__ import annotations

import threading
from typing import Any

from harness.memory.tree import MemoryReadError, tree_memory

__all__ = ["DEFAULT_INTERVAL_S", "TreePeak"]

DEFAULT_INTERVAL_S = 0.05
"""Seconds between two samples: reading one process's status costs about 0.1 ms."""
MiB = float(1 << 20)


class TreePeak:
    """Sample the tree of ``root_pid`` in a daemon thread while the ``with`` block (or
    :meth:`start` .. :meth:`stop`) runs.

    Args:
        root_pid: the tree's root (this process for in-process arms; the server's pid for ``serve``).
        interval_s: seconds between samples (> 0).

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(self, root_pid: int, interval_s: float = DEFAULT_INTERVAL_S):
        if not interval_s > 0:
            raise ValueError(f"TreePeak: interval_s must be > 0 s, got {interval_s!r}")
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.peak_anon = 0
        self.peak_total = 0
        self.samples = 0
        self.skipped = 0
        self._hwm: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        from omni_platform.procfs import status_bytes

        tree = tree_memory(self.root_pid)
        if not tree:
            return
        self.samples += 1
        self.peak_anon = max(self.peak_anon, sum(p.rss_anon for p in tree))
        self.peak_total = max(self.peak_total, sum(p.rss_anon + p.rss_file + p.rss_shmem for p in tree))
        for p in tree:
            try:
                self._hwm[p.pid] = {"role": p.role, "vm_hwm": status_bytes("VmHWM", p.pid)}
            except (OSError, KeyError):
                continue  # gone between the two reads: its last VmHWM is kept

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except MemoryReadError:
                # a process caught between fork and exec, or exiting, has a status without its Rss lines for
                # a moment (vLLM's start spawns and reaps several): this sample is skipped, counted, and the
                # next one taken; the peak stays a lower bound
                self.skipped += 1
            self._stop.wait(self.interval_s)

    def start(self) -> TreePeak:
        self._thread = threading.Thread(target=self._run, name="omni-tree-peak", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        """Stop sampling, after one last sample (the state at stop counts).

        A sample in which a process could not be read (caught between fork and exec, or exiting) is
        skipped and counted in :meth:`hwm` (``skipped_samples``).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._sample()
        except MemoryReadError:
            self.skipped += 1
        return self

    def __enter__(self) -> TreePeak:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def metrics(self) -> dict[str, float]:
        """``peak_anon_tree_mb`` and ``peak_total_tree_mb`` (MiB), the largest sampled sums.

        Raises:
            MemoryReadError: no sample was taken (the tree was gone before the first one).
        """
        if not self.samples:
            raise MemoryReadError(f"no memory sample of the tree of {self.root_pid} was taken")
        return {"peak_anon_tree_mb": self.peak_anon / MiB, "peak_total_tree_mb": self.peak_total / MiB}

    def hwm(self) -> dict[str, Any]:
        """Per process seen: role and ``VmHWM`` in bytes (each process's own resident peak), with the
        sampling interval and count, for an artifact's provenance."""
        return {"interval_s": self.interval_s, "samples": self.samples, "skipped_samples": self.skipped,
                "vm_hwm": {str(pid): v for pid, v in self._hwm.items()}}
