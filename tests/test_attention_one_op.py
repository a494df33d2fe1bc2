"""OMNI_CPU_ATTN_ONE_OP=1: vLLM's CPU attention with the KV write inside; same greedy tokens, eager and compiled."""

import pytest

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

PROMPTS = ["Once upon a time", "def fibonacci(n):", list(range(100, 700))]  # the last one spans 5 KV blocks


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "compiled"])
def test_one_op_attention_gives_the_same_tokens(int4_model_dir, tmp_path, eager):
    llm = {"model": str(int4_model_dir), "enforce_eager": eager, "max_model_len": 1024,
           "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 4}
    config = {"llm": llm, "prompts": PROMPTS, "max_tokens": 24}
    env = dict(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    one = run_engine(config, clean_env(OMNI_CPU_ATTN_ONE_OP="1", **env))
    two = run_engine(config, clean_env(**env))
    assert "omni: attention backend OmniCpuAttentionBackend, one op per layer" in one.log
    assert "OmniCpuAttentionBackend" not in two.log
    assert all(len(t) == 24 for t in one["token_ids"])
    assert one["token_ids"] == two["token_ids"]
