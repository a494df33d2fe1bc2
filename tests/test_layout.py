"""omni_platform.layout: which process layout and step budget, from what the user chose."""

import pytest

from omni_platform.layout import (
    SMALL_MAX_NUM_BATCHED_TOKENS,
    SMALL_MAX_NUM_SEQS,
    plan_layout,
    small_machine_batch_defaults,
)

BASE = dict(world_size=1, data_parallel_size=1, executor_backend="uni", user_multiprocessing=None,
            user_threads_bind=False, physical_cores=2, few_cpus=4)


def test_small_machine_one_worker_runs_in_process():
    plan = plan_layout(**BASE)
    assert plan.in_process and "2 physical core(s)" in plan.reason
    assert plan_layout(**{**BASE, "executor_backend": None}).in_process


@pytest.mark.parametrize("change, words", [
    ({"user_multiprocessing": "1"}, "VLLM_ENABLE_V1_MULTIPROCESSING=1 set by the user"),
    ({"user_multiprocessing": "0"}, "VLLM_ENABLE_V1_MULTIPROCESSING=0 set by the user"),
    ({"world_size": 2}, "world size 2"),
    ({"data_parallel_size": 2}, "data parallel 2"),
    ({"executor_backend": "mp"}, "distributed_executor_backend='mp' set by the user"),
    ({"user_threads_bind": True}, "VLLM_CPU_OMP_THREADS_BIND set by the user"),
    ({"physical_cores": 8}, "8 physical cores > OMNI_FEW_CPUS=4"),
])
def test_anything_the_user_chose_or_a_larger_machine_keeps_vllms_layout(change, words):
    plan = plan_layout(**{**BASE, **change})
    assert not plan.in_process
    assert words in plan.reason


def test_step_budget_only_on_small_machines():
    assert small_machine_batch_defaults(2, 4) == (SMALL_MAX_NUM_BATCHED_TOKENS, SMALL_MAX_NUM_SEQS) == (512, 8)
    assert small_machine_batch_defaults(4, 4) == (512, 8)
    assert small_machine_batch_defaults(5, 4) is None
