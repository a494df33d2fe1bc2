"""Thread-binding plan (omni_platform.binding): properties over CPU topologies."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import cpu_topologies

from omni_platform.binding import BindingError, CpuCore, format_cpu_list, plan_binding


def test_two_core_machine_uses_both_cores_and_reserves_none():
    plan = plan_binding([CpuCore(0, 0), CpuCore(1, 1)], local_world_size=1, few_cpus=4)
    assert plan.threads_bind == "0-1"
    assert plan.reserved == ()


def test_two_workers_on_two_cores_get_one_each():
    plan = plan_binding([CpuCore(1, 1), CpuCore(0, 0)], local_world_size=2, few_cpus=4)
    assert plan.threads_bind == "0|1"


def test_taskset_single_cpu():
    plan = plan_binding([CpuCore(1, 1)], local_world_size=1, few_cpus=4)
    assert plan.threads_bind == "1"


def test_big_machine_reserves_the_last_core():
    plan = plan_binding([CpuCore(i, i) for i in range(8)], local_world_size=1, few_cpus=4)
    assert plan.reserved == (7,)
    assert plan.threads_bind == "0-6"


def test_smt_siblings_use_one_cpu_per_core():
    cpus = [CpuCore(0, 0), CpuCore(2, 0), CpuCore(1, 1), CpuCore(3, 1)]
    assert plan_binding(cpus, 1, 4).threads_bind == "0-1"


def test_more_workers_than_cores_is_refused_with_counts():
    with pytest.raises(BindingError, match="2 local CPU workers need at least 2 physical cores"):
        plan_binding([CpuCore(0, 0)], local_world_size=2, few_cpus=4)


def test_empty_affinity_is_refused():
    with pytest.raises(BindingError, match="no CPU"):
        plan_binding([], 1, 4)


@given(cpu_topologies(), st.integers(1, 4), st.integers(0, 8))
def test_plan_partitions_one_cpu_per_core(cpus, world, few):
    cores = {c.physical_core for c in cpus}
    try:
        plan = plan_binding(cpus, world, few)
    except BindingError:
        reserve = 0 if len(cores) <= few else 1
        assert len(cores) - reserve < world
        return
    used = [c for w in plan.per_worker for c in w]
    assert len(plan.per_worker) == world
    assert all(plan.per_worker), "every worker gets at least one CPU"
    assert len(set(used) | set(plan.reserved)) == len(used) + len(plan.reserved) == len(cores)
    assert len(plan.reserved) == (0 if len(cores) <= few else 1)
    by_cpu = {c.cpu: c.physical_core for c in cpus}
    assert {by_cpu[c] for c in used + list(plan.reserved)} == cores
    sizes = [len(w) for w in plan.per_worker]
    assert max(sizes) - min(sizes) <= 1


@given(st.lists(st.integers(0, 200), min_size=1, max_size=40))
def test_format_cpu_list_round_trips_through_vllm_parser(ids):
    from vllm.utils.cpu_resource_utils import parse_id_list

    assert parse_id_list(format_cpu_list(ids)) == sorted(set(ids))
