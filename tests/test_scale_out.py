"""tensor_parallel_size=2 on one NUMA node: OmniPlatform splits the CPUs among the workers."""

import os

import pytest

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

PROMPTS = [[1, 17, 42, 99, 7], [1, 300, 5, 5, 5, 12, 400], [1, 2, 3]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_tp2_greedy_equals_tp1(tiny_llama):
    def run(tp):
        config = {"llm": {"model": str(tiny_llama), "enforce_eager": True, "skip_tokenizer_init": True,
                          "tensor_parallel_size": tp, "max_model_len": 256, "max_num_seqs": 4,
                          "dtype": "float32"},
                  "prompts": PROMPTS, "max_tokens": 24}
        return run_engine(config, clean_env(VLLM_PLUGINS="omni"))

    tp1, tp2 = run(1), run(2)
    assert len(tp2["workers"]) == 2
    cpus = [w["threads_cpus"] for w in tp2["workers"]]
    assert not set(cpus[0]) & set(cpus[1]), f"each worker has its own CPUs: {cpus}"
    assert "VLLM_CPU_OMP_THREADS_BIND='0|1'" in tp2.log or len(os.sched_getaffinity(0)) > 2
    assert tp2["token_ids"] == tp1["token_ids"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_c17_pp2_greedy_equals_pp1(tiny_llama):
    """pipeline_parallel_size=2 on CPU, eager (omni-patches' _patch_cpu_pipeline_parallel_eager):
    the same greedy tokens as one stage."""
    def run(pp, **env):
        config = {"llm": {"model": str(tiny_llama), "enforce_eager": True, "skip_tokenizer_init": True,
                          "pipeline_parallel_size": pp, "max_model_len": 256, "max_num_seqs": 4,
                          "dtype": "float32"},
                  "prompts": PROMPTS, "max_tokens": 24}
        return run_engine(config, clean_env(VLLM_PLUGINS="omni", **env))

    pp1, pp2 = run(1), run(2)
    assert len(pp2["workers"]) == 2
    assert "pipeline stage 1: intermediate tensors" in pp2.log
    assert pp2["token_ids"] == pp1["token_ids"]
