"""Hypothesis strategies shared by the tests."""

from hypothesis import strategies as st

from omni_platform.binding import CpuCore


@st.composite
def cpu_topologies(draw, max_cores: int = 16) -> list[CpuCore]:
    """Allowed CPU lists: 1..max_cores physical cores, 1 or 2 logical CPUs each, ids shuffled."""
    n_cores = draw(st.integers(1, max_cores))
    smt = draw(st.sampled_from([1, 2]))
    cores = draw(st.lists(st.integers(0, 63), min_size=n_cores, max_size=n_cores, unique=True))
    cpus: list[CpuCore] = []
    for i, core in enumerate(cores):
        for t in range(smt):
            cpus.append(CpuCore(cpu=core + 64 * t if smt == 2 else core, physical_core=i))
    return draw(st.permutations(cpus))
