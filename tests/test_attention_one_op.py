"""omni's default attention (vLLM's CPU attention with the KV write inside, one op a layer) against vLLM's
(``OMNI_CPU_ATTN_ONE_OP=0``, two ops a layer): the same greedy tokens, eager and compiled.

Eager runs the real SmolLM2 cpu_int4 checkpoint. Compiled runs a random 2-layer Llama (float32,
no tokenizer): compiling the real model's 30 layers cold costs ~150 s per engine on two cores and
the attention op is the same at any depth."""

import re

import pytest

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

SPANS_5_BLOCKS = list(range(100, 700))
PROMPTS = {"eager": ["Once upon a time", "def fibonacci(n):", SPANS_5_BLOCKS],
           "compiled": [[1, 17, 42, 99, 7, 300], [1, 250, 3, 8, 8, 91, 77], SPANS_5_BLOCKS]}


@pytest.fixture(scope="module")
def tiny_llama_1k(tmp_path_factory):
    from omni_platform.testing import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-1k"), vocab_size=1024)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_one_op_attention_gives_the_same_tokens(mode, request, tmp_path):
    eager = mode == "eager"
    model = request.getfixturevalue("int4_model_dir" if eager else "tiny_llama_1k")
    llm = {"model": str(model), "enforce_eager": eager, "max_model_len": 1024,
           "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 4, "skip_tokenizer_init": not eager}
    config = {"llm": llm, "prompts": PROMPTS[mode], "max_tokens": 24}
    env = dict(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    one = run_engine(config, clean_env(**env))
    two = run_engine(config, clean_env(OMNI_CPU_ATTN_ONE_OP="0", **env))
    assert "omni: attention backend OmniCpuAttentionBackend, one op per layer" in one.log
    assert "OmniCpuAttentionBackend" not in two.log
    # compiled: each run compiled its own graph (vLLM logs the AOT artifact it saves, keyed by a hash
    # of the config; one-op and two-op must not share one); eager: nothing compiled
    saved = [re.findall(r"saved AOT compiled function to (\S+)", run.log) for run in (one, two)]
    assert all(len(s) == (0 if eager else 1) for s in saved), saved
    assert eager or saved[0] != saved[1]
    assert all(len(t) == 24 for t in one["token_ids"])
    assert one["token_ids"] == two["token_ids"]
