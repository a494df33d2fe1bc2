"""Process layout and step budget on small machines: pure decisions, no vLLM import.

vLLM 0.28 on CPU runs three processes for ``vllm.LLM`` and for the OpenAI server: the
front end, the engine core and one worker, because ``CpuPlatform.check_and_update_config``
(``vllm/platforms/cpu.py``) turns the single-process ``uni`` executor into ``mp`` unless
``VLLM_ENABLE_V1_MULTIPROCESSING=0``. On two cores the extra process costs a core's
worth of spinning: the engine core and worker exchange every step through a shared-memory
queue whose readers spin with ``sched_yield`` after each read
(``vllm/distributed/device_communicators/shm_broadcast.py``). :func:`plan_layout` keeps
the worker in the process that schedules it instead:

- ``vllm.LLM``: one process (``LLMEngine`` with an in-process engine core,
  ``v1/engine/core_client.py`` ``InprocClient``, and the ``uni`` executor);
- the OpenAI server: two processes (``AsyncLLM`` always keeps the engine core in a
  process of its own; the worker lives inside it).

:func:`small_machine_batch_defaults` gives the step budget used when the user sets
neither ``max_num_batched_tokens`` nor ``max_num_seqs``. vLLM's CPU defaults (4096 and
256 for ``vllm.LLM``, 2048 and 128 for the server; ``EngineArgs.get_batch_defaults``)
size the compiled-mode warm-up forward and the sampler warm-up over
``max_num_seqs`` x vocabulary, which on two cores cost more start-up than they buy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "SMALL_MAX_NUM_BATCHED_TOKENS",
    "SMALL_MAX_NUM_SEQS",
    "LayoutPlan",
    "plan_layout",
    "small_machine_batch_defaults",
]

SMALL_MAX_NUM_BATCHED_TOKENS = 512
"""Tokens per scheduler step on a small machine (pp512 fits one step; longer prompts are
prefilled in chunks of this size). Also the size of the compiled-mode warm-up forward."""

SMALL_MAX_NUM_SEQS = 8
"""Sequences decoded together on a small machine; also rows of the sampler warm-up."""


@dataclass(frozen=True)
class LayoutPlan:
    """Where the worker runs.

    ``in_process`` True: the worker runs inside the engine core (``uni`` executor,
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``vllm.LLM`` is one process and the OpenAI
    server two. False: vLLM's own layout is left alone. ``reason`` says why, for the log.
    """

    in_process: bool
    reason: str


def plan_layout(*, world_size: int, data_parallel_size: int, executor_backend: object,
                user_multiprocessing: str | None, user_threads_bind: bool,
                physical_cores: int, few_cpus: int) -> LayoutPlan:
    """Decide the process layout from what the user chose and the machine's size.

    Args:
        world_size: ``tensor_parallel_size`` x ``pipeline_parallel_size``.
        data_parallel_size: ``data_parallel_size``.
        executor_backend: ``parallel_config.distributed_executor_backend`` before vLLM's
            CPU platform rewrites it (``"uni"`` is what vLLM picks by itself at world size 1).
        user_multiprocessing: ``VLLM_ENABLE_V1_MULTIPROCESSING`` as the user set it, or
            ``None`` when the user did not set it.
        user_threads_bind: whether the user set ``VLLM_CPU_OMP_THREADS_BIND`` (which only
            vLLM's ``mp`` executor honours).
        physical_cores: physical cores the process may use.
        few_cpus: ``OMNI_FEW_CPUS``: at most this many cores is a small machine.
    """
    if user_multiprocessing is not None:
        return LayoutPlan(False, f"VLLM_ENABLE_V1_MULTIPROCESSING={user_multiprocessing} set by the user")
    if world_size != 1 or data_parallel_size != 1:
        return LayoutPlan(False, f"world size {world_size}, data parallel {data_parallel_size}: one worker per rank")
    if executor_backend not in (None, "uni"):
        return LayoutPlan(False, f"distributed_executor_backend={executor_backend!r} set by the user")
    if user_threads_bind:
        return LayoutPlan(False, "VLLM_CPU_OMP_THREADS_BIND set by the user (honoured by the mp executor only)")
    if physical_cores > few_cpus:
        return LayoutPlan(False, f"{physical_cores} physical cores > OMNI_FEW_CPUS={few_cpus}")
    return LayoutPlan(True, f"one worker on {physical_cores} physical core(s) <= OMNI_FEW_CPUS={few_cpus}")


def small_machine_batch_defaults(physical_cores: int, few_cpus: int) -> tuple[int, int] | None:
    """``(max_num_batched_tokens, max_num_seqs)`` for a small machine, ``None`` on a larger one."""
    if physical_cores > few_cpus:
        return None
    return SMALL_MAX_NUM_BATCHED_TOKENS, SMALL_MAX_NUM_SEQS
