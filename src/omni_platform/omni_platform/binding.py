"""OpenMP thread binding for the CPU workers, planned from the process's CPU affinity.

Stock vLLM 0.28 (``vllm/utils/ompmultiprocessing.py``, ``VLLM_CPU_OMP_THREADS_BIND=auto``)
binds local worker *i* to NUMA node *i* and reserves one core for the engine core
process. On a 2-core, 1-node machine that means decoding on one core, and
``tensor_parallel_size=2`` refuses to start ("Not enough allowed NUMA nodes").

:func:`plan_binding` instead takes the physical cores the process may use (its
``sched_getaffinity``, so ``taskset`` is respected), reserves none on small machines,
and splits the rest among the local workers in contiguous runs. The result is
expressed in vLLM's own variables (``VLLM_CPU_OMP_THREADS_BIND`` with ``|`` between
workers, ``VLLM_CPU_NUM_OF_RESERVED_CPU``), which vLLM reads in the engine core.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BindingError", "BindingPlan", "CpuCore", "format_cpu_list", "plan_binding"]


class BindingError(RuntimeError):
    """The allowed CPUs cannot host the requested local workers."""


@dataclass(frozen=True, order=True)
class CpuCore:
    """A logical CPU id and the physical core it belongs to (from ``lscpu``)."""

    cpu: int
    physical_core: int


@dataclass(frozen=True)
class BindingPlan:
    """Which logical CPUs each local worker's OpenMP threads are bound to.

    ``per_worker[i]`` is the sorted list of logical CPU ids of local rank ``i``;
    ``reserved`` are the ids left for the engine core and front end.
    """

    per_worker: tuple[tuple[int, ...], ...]
    reserved: tuple[int, ...]
    reason: str

    @property
    def threads_bind(self) -> str:
        """The value for ``VLLM_CPU_OMP_THREADS_BIND``, e.g. ``"0-1"`` or ``"0|1"``."""
        return "|".join(format_cpu_list(cpus) for cpus in self.per_worker)


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """Format CPU ids as a Linux cpu list: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def plan_binding(allowed: list[CpuCore], local_world_size: int, few_cpus: int) -> BindingPlan:
    """Plan the thread binding of ``local_world_size`` workers on the ``allowed`` CPUs.

    One logical CPU per physical core is used (the lowest id of each core), as stock
    vLLM does on x86. With at most ``few_cpus`` physical cores no core is reserved;
    above that, the last core is reserved for the engine core process (stock rule).

    Raises:
        BindingError: no allowed CPU, a non-positive ``local_world_size``, or fewer
            usable cores than local workers.
    """
    if local_world_size < 1:
        raise BindingError(f"local_world_size must be >= 1, got {local_world_size}")
    if not allowed:
        raise BindingError("the process may run on no CPU (empty affinity)")
    first_of_core: dict[int, int] = {}
    for c in sorted(allowed):
        first_of_core.setdefault(c.physical_core, c.cpu)
    cores = sorted(first_of_core.values())
    n = len(cores)
    reserve = 0 if n <= few_cpus else 1
    usable, reserved = cores[: n - reserve], cores[n - reserve :]
    if len(usable) < local_world_size:
        raise BindingError(
            f"{local_world_size} local CPU workers need at least {local_world_size} "
            f"physical cores, but the process may use {n} ({format_cpu_list(cores)}) "
            f"and {reserve} is reserved. Lower tensor_parallel_size/pipeline_parallel_size, "
            "widen the CPU affinity, or set VLLM_CPU_OMP_THREADS_BIND yourself."
        )
    base, extra = divmod(len(usable), local_world_size)
    per_worker: list[tuple[int, ...]] = []
    start = 0
    for rank in range(local_world_size):
        size = base + (1 if rank < extra else 0)
        per_worker.append(tuple(usable[start : start + size]))
        start += size
    reason = (
        f"{n} physical core(s) allowed by the process affinity "
        f"({'<=' if reserve == 0 else '>'} OMNI_FEW_CPUS={few_cpus}: reserve {reserve}), "
        f"split among {local_world_size} local worker(s)"
    )
    return BindingPlan(tuple(per_worker), tuple(reserved), reason)
