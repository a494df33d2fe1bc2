"""Pre-flight system checks: run nothing on cores that are busy or not ours.

Each check is a small class in an ordered list (in the manner of pyperf's system
checks); each returns findings at level ``error``, ``warning`` or ``advice``.
``harness.grid.bench`` refuses to run on any error unless ``--allow-busy``, and then labels
the result.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AffinityCheck", "CoreIdleCheck", "Finding", "run_checks"]

Sampler = Callable[[float], list[float]]
"""Takes a window in seconds, returns the utilisation (percent) of every CPU over it."""


@dataclass(frozen=True)
class Finding:
    """One check's outcome: ``level`` is ``error``, ``warning`` or ``advice``."""

    check: str
    level: str
    message: str


def _psutil_sampler(window_s: float) -> list[float]:
    import psutil

    return psutil.cpu_percent(interval=window_s, percpu=True)


class AffinityCheck:
    """The target cores exist and this process may run on them."""

    name = "affinity"

    def run(self, cores: list[int], **_: object) -> list[Finding]:
        allowed = os.sched_getaffinity(0)
        missing = [c for c in cores if c not in allowed]
        if missing:
            return [Finding(self.name, "error",
                            f"cores {missing} are not in this process's affinity {sorted(allowed)}")]
        return []


class CoreIdleCheck:
    """Per-core utilisation over two windows, the minimum of the two per core.

    Refuses when the mean over the target cores exceeds ``max_mean_pct`` or any one
    core exceeds ``max_core_pct``. Taking the minimum of two windows forgives a single
    burst but not a steady load.
    """

    name = "cores-idle"

    def __init__(self, max_mean_pct: float = 5.0, max_core_pct: float = 50.0, window_s: float = 1.0,
                 sampler: Sampler | None = None):
        self.max_mean_pct = max_mean_pct
        self.max_core_pct = max_core_pct
        self.window_s = window_s
        self.sampler = sampler or _psutil_sampler

    def run(self, cores: list[int], **_: object) -> list[Finding]:
        a = self.sampler(self.window_s)
        b = self.sampler(self.window_s)
        util = {c: min(a[c], b[c]) for c in cores}
        mean = sum(util.values()) / len(util)
        findings = []
        busy = {c: u for c, u in util.items() if u > self.max_core_pct}
        if busy:
            findings.append(Finding(self.name, "error", f"busy cores (percent, min of two {self.window_s:g} s "
                                                        f"windows): {busy} > {self.max_core_pct:g}%"))
        if mean > self.max_mean_pct:
            findings.append(Finding(self.name, "error",
                                    f"mean utilisation of cores {cores} is {mean:.1f}% > {self.max_mean_pct:g}%"))
        if not findings:
            idle = ", ".join(f"{c}: {u:.1f}%" for c, u in util.items())
            findings.append(Finding(self.name, "advice", f"cores {cores} idle: {{{idle}}}"))
        return findings


def run_checks(cores: list[int], checks: list | None = None) -> list[Finding]:
    """Run ``checks`` (default: affinity, then idleness) in order; stop after an affinity error."""
    checks = checks if checks is not None else [AffinityCheck(), CoreIdleCheck()]
    findings: list[Finding] = []
    for check in checks:
        found = check.run(cores=cores)
        findings.extend(found)
        if isinstance(check, AffinityCheck) and any(f.level == "error" for f in found):
            break
    return findings
