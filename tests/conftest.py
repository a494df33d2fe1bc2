"""Shared fixtures: the real model, a tiny synthetic checkpoint, and running a real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The order of the modules for xdist (tests/schedule.py): the longest first.
from schedule import longest_first

# The CI skip policy (tests/skips.py): under CI a skip that is not a declared machine condition fails.
from skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parent.parent
ENGINE_PROBE = REPO / "tests" / "engine_probe.py"
RESULT_PREFIX = "ENGINE_PROBE_RESULT "

# Variables of the developer's shell that would change what a test measures.
_SCRUB_PREFIXES = ("VLLM_", "OMNI_", "OMP_", "GOMP_", "KMP_")

# The one user choice the suite carries into every engine: `VLLM_ENABLE_V1_MULTIPROCESSING=1
# make test` runs every engine in vLLM's own three-process layout instead of omni's default.
_KEPT = ("VLLM_ENABLE_V1_MULTIPROCESSING",)
USER_LAYOUT = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")


def clean_env(**overrides: str) -> dict[str, str]:
    """os.environ without VLLM_*/OMNI_*/OpenMP variables (but the user's layout choice), plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES) or k in _KEPT}
    env.update(overrides)
    return env


# `make test`'s engine phase (Makefile) runs two pytest workers with OMNI_TEST_PIN=1: each worker, and so every
# engine it starts, is pinned to a CPU of its own (omni plans its threads from the affinity), so no OpenMP
# barrier waits on another engine's threads. Tests that need two CPUs (tensor or pipeline parallel) are
# marked `two_cores` and run afterwards in one unpinned process; a pinned worker refuses to run them.
PIN = os.environ.get("OMNI_TEST_PIN") == "1"


def pytest_configure(config) -> None:
    """Pin this xdist worker to one allowed CPU (worker i takes the i-th) when OMNI_TEST_PIN=1."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if PIN and worker.startswith("gw"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(worker[2:]) % len(cpus)]})


def pytest_report_header(config) -> str:
    """The CPU in front of this run (model, ISA flags, the W4A8 kernel's instruction sets): kernel
    choices differ by machine kind, so a failure read from a CI log must say where it ran."""
    from harness.provenance import collect_cpu
    from omni_quant.kernels import w4a8 as native

    cpu = collect_cpu(sorted(os.sched_getaffinity(0)))
    return f"cpu: {cpu['cpu_model']}; flags: {' '.join(cpu['cpu_flags'])}; W4A8 kernel: {native.supported_isas()}"


@pytest.hookimpl(trylast=True)  # after `-m` has deselected
def pytest_collection_modifyitems(config, items) -> None:
    """The longest modules first (tests/schedule.py). Under OMNI_TEST_PIN=1, a `two_cores` test selected for a
    pinned run is an error, not a silent skip."""
    longest_first(items)
    if PIN and os.environ.get("PYTEST_XDIST_WORKER"):
        wrong = [it.nodeid for it in items if it.get_closest_marker("two_cores")]
        if wrong:
            raise pytest.UsageError(f"two_cores tests selected in a pinned run (deselect them: -m 'not two_cores'): "
                                    f"{wrong[:3]}")


# Not a declared machine condition (tests/skips.py): CI does not set the variable, and if it did,
# these skips would fail there.
needs_default_layout = pytest.mark.skipif(
    USER_LAYOUT is not None,
    reason=f"VLLM_ENABLE_V1_MULTIPROCESSING={USER_LAYOUT} set for the run: omni's default layout is not in use",
)


class EngineRun:
    """The outcome of one engine_probe.py subprocess: parsed result and full log."""

    def __init__(self, result: dict[str, Any], log: str):
        self.result = result
        self.log = log

    def __getitem__(self, key: str) -> Any:
        return self.result[key]


def run_engine(config: dict[str, Any], env: dict[str, str], prefix: list[str] | None = None,
               timeout: float = 900) -> EngineRun:
    """Start ``tests/engine_probe.py`` in a fresh process (its own engine core and worker)."""
    env = {**env, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    cmd = [*(prefix or []), sys.executable, str(ENGINE_PROBE), json.dumps(config)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    log = proc.stdout + "\n" + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(log.splitlines()[-60:])
        raise AssertionError(f"engine probe failed (exit {proc.returncode}):\n{tail}")
    return EngineRun(json.loads(lines[-1][len(RESULT_PREFIX):]), log)


@pytest.fixture(scope="session")
def real_model() -> Path:
    """The bf16 SmolLM2-135M checkpoint (fetched once; idempotent)."""
    from harness.models.registry import fetch

    return fetch("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama (4 heads, 2 KV heads, float32), no tokenizer."""
    from omni_platform.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def int4_model_dir(real_model) -> Path:
    """SmolLM2-135M converted to cpu_int4 (harness.models.registry, cached)."""
    from harness.models.registry import fetch

    return fetch("smollm2-135m-int4")


def step_gap(a: EngineRun, b: EngineRun) -> float:
    """The largest difference, in nats, between two engines' log-probabilities of the same greedy token, over the
    steps where their tokens still agree (each run with ``"logprobs": K``): how far two numerical paths part."""
    gap = 0.0
    for ta, tb, la, lb in zip(a["token_ids"], b["token_ids"], a["logprobs"], b["logprobs"], strict=True):
        n = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
        gap = max([gap, *(abs(la[k][str(ta[k])] - lb[k][str(ta[k])]) for k in range(n))])
    return gap


def assert_greedy_close(a: EngineRun, b: EngineRun, step_nats: float) -> list[int]:
    """Two engines' greedy outputs of the same prompts (each run with ``"logprobs": K``) agree up to rounding:
    while their tokens agree, each token's log-probability differs by at most ``step_nats`` between the two;
    where they first part (token x from ``a``, y from ``b``), each is in the other's top K and the two were
    nearly tied in both, by at most ``2 * step_nats`` (what two models within ``step_nats`` of each other can
    flip). After that point the contexts differ and nothing is compared. Returns, per prompt, how many tokens
    agree before they part (the whole length when they do not).

    Raises:
        AssertionError: naming the prompt, the step and the numbers.
    """
    agree = []
    for i, (ta, tb, la, lb) in enumerate(zip(a["token_ids"], b["token_ids"], a["logprobs"], b["logprobs"],
                                             strict=True)):
        n = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
        for k in range(n):
            t = str(ta[k])
            assert abs(la[k][t] - lb[k][t]) <= step_nats, (
                f"prompt {i} step {k}: token {t} has log-probability {la[k][t]:.4f} in one and {lb[k][t]:.4f} in "
                f"the other, more than {step_nats} apart")
        if n < min(len(ta), len(tb)):
            x, y = str(ta[n]), str(tb[n])
            for name, lp, mine, other in (("first", la[n], x, y), ("second", lb[n], y, x)):
                assert other in lp, f"prompt {i} step {n}: the {name} engine's top tokens {lp} lack {other}"
                assert lp[mine] - lp[other] <= 2 * step_nats, (
                    f"prompt {i} step {n}: tokens {x} and {y} part, but the {name} engine prefers its own by "
                    f"{lp[mine] - lp[other]:.4f} nats > {2 * step_nats}: not a near tie")
        agree.append(n)
    return agree


def run_probe(script: str, args: list[str], env: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    """Run ``python -c script args...`` in a fresh interpreter with ``env``; return the JSON of its last stdout line
    that starts with ``PROBE `` (the patch-switch probes: tests/test_patches_off.py, tests/test_patch_switches.py).

    Raises:
        AssertionError: the interpreter failed or printed no such line (its stderr's tail attached).
    """
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])
