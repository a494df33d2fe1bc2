"""The host's state before each pass: a multi-threaded float sum over a buffer larger than the caches.

Why: on the 2-vCPU hosts we measure on, the same arm's decode rate falls into two states that switch
from minute to minute (one-off runs on 2026-12-05, not artifacts: omni's decode on Qwen2.5-Coder-1.5B at
about 31 or about 43 tok/s in separate processes on the same cores, and switching inside one process),
and a 2-thread float32 sum over 512 MiB switched with it (about 29 or 38 GB/s) while one thread stayed
at about 19.5 GB/s: the second core's throughput, not DRAM alone (a 2-thread integer sum, which one core
nearly saturates, did not switch). A pass's number is then
partly the host's state at that moment. So :func:`run_grid <harness.grid.bench.run_grid>` asks one
probe process, pinned to the arms' cores and started once per run, for a reading before every pass,
records it in the pass (``extra.host_sum_gbs``) and labels the artifact when the readings spread
(:func:`spread_label`): passes in different states are not comparable, and the artifact says so.

    python -m harness.grid.host_probe          # serves readings: one line in, one GB/s value out

The probe sums with torch (the arms' own OpenMP runtime and vector code, one thread per pinned core),
best of 3 sums of 512 MiB of float32; it waits on its stdin between readings and holds no CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness import REPO

__all__ = ["HostProbe", "SPREAD_PCT", "spread_label"]

SPREAD_PCT = 15.0
"""Readings whose highest exceeds their lowest by more than this (percent) label the artifact."""
BUFFER_BYTES = 512 << 20
LABEL = "HOST STATE CHANGED DURING RUN"


class HostProbe:
    """One probe process pinned to ``cores``; :meth:`read` returns a reading in GB/s (bytes summed per
    second / 1e9), or None when the probe failed (it then stays off for the run, and the artifact's
    ``extra.host_sum_gbs`` is None for those passes). A context manager; :meth:`close` ends the process."""

    def __init__(self, cores: list[int]):
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness.grid.host_probe"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
                                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
        except OSError:
            self.proc = None

    def read(self) -> float | None:
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            self.proc.stdin.write("read\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            return float(line)
        except (OSError, ValueError):
            self.close()
            return None

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
            self.proc = None

    def __enter__(self) -> HostProbe:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spread_label(readings: list[float | None]) -> str | None:
    """The artifact label when the readings (None: no reading) spread by more than :data:`SPREAD_PCT`, else None."""
    got = [r for r in readings if r]
    if len(got) < 2 or max(got) <= min(got) * (1 + SPREAD_PCT / 100):
        return None
    return (f"{LABEL}: the host probe read {min(got):.1f} to {max(got):.1f} GB/s before the passes "
            f"(+{100 * (max(got) / min(got) - 1):.0f}%); compare passes with similar runs[].extra.host_sum_gbs")


def _serve() -> None:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    x = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
    for _ in sys.stdin:
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - t)
        print(f"{BUFFER_BYTES / best / 1e9:.3f}", flush=True)


if __name__ == "__main__":
    _serve()
