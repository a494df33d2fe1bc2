"""Greedy output does not depend on the batch or on speculation (issue 33 item 1; C26).

vLLM's CPU attention splits one sequence's KV among threads when a step has fewer requests than
threads (``VLLM_CPU_ATTN_SPLIT_KV``, vLLM's default 1): the float sums then depend on the step's
other requests, and near-ties flip greedy tokens. OmniPlatform sets it to 0 (``_configure_attention_kv_split``).
On the real SmolLM2 int4, eager, in one probe process: sixteen concurrent greedy requests with
``max_num_seqs`` 16 equal each request alone, with ample KV and with a KV budget for about six
sequences (preemption), 200 tokens each (C26); ngram speculation with k=4 gives the tokens of the plain run (C24).
"""

import os

import pytest

from conftest import clean_env, run_engine

MiB = 1 << 20
SMOLLM2_BLOCK = 30 * 2 * 128 * 3 * 64 * 2  # bytes of one 128-token KV block, bf16

PROMPTS = ["Once upon a time", "The three primary colors are", "def fibonacci(n):", "The capital of France is",
           "To make a cup of tea,", "Photosynthesis is", "User: What is 2 + 2?\nAssistant:", "import numpy as np\n",
           "The history of Rome", "In computer science, a hash table", "My favourite recipe for bread",
           "Write a poem about the sea:", "class Stack:\n", "The theory of relativity says", "Dear hiring manager,",
           "SELECT name FROM users WHERE"]
SPEC_PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
                "# the same function, with a comment on every line:\n",
                "Once upon a time", "List the numbers from 1 to 40, separated by commas: 1, 2, 3,"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}  # C24: k=4


@pytest.fixture(scope="module")
def runs(int4_model_dir):
    def llm(**kw):
        return {"model": str(int4_model_dir), "enforce_eager": True, "max_model_len": 512, **kw}

    config = {"runs": [
        {"llm": llm(max_num_seqs=16, kv_cache_memory_bytes=256 * MiB), "prompts": PROMPTS, "max_tokens": 200,
         "also_alone": True},
        # 2 blocks a sequence (prompt + 200 tokens < 256): twelve blocks hold about six of the sixteen
        {"llm": llm(max_num_seqs=16, kv_cache_memory_bytes=12 * SMOLLM2_BLOCK), "prompts": PROMPTS,
         "max_tokens": 200},
        {"llm": llm(max_num_seqs=4, kv_cache_memory_bytes=256 * MiB), "prompts": SPEC_PROMPTS, "max_tokens": 128},
        {"llm": llm(max_num_seqs=4, kv_cache_memory_bytes=256 * MiB, speculative_config=NGRAM),
         "prompts": SPEC_PROMPTS, "max_tokens": 128, "also_alone": True},
    ]}
    return run_engine(config, clean_env(VLLM_PLUGINS="omni"))


def _first_differences(got, want):
    return {i: next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b}


@pytest.mark.engine
def test_c26_sixteen_concurrent_greedy_requests_equal_each_alone(runs):
    ample = runs["runs"][0]
    assert _first_differences(ample["token_ids"], ample["alone_token_ids"]) == {}
    assert "VLLM_CPU_ATTN_SPLIT_KV=0" in runs.log


@pytest.mark.engine
def test_c26_with_preemption_too(runs):
    ample, tight = runs["runs"][0], runs["runs"][1]
    assert tight["workers"][0]["kv_cache"]["num_blocks"] == 12
    assert _first_differences(tight["token_ids"], ample["alone_token_ids"]) == {}


@pytest.mark.engine
def test_c24_ngram_speculation_gives_the_tokens_of_the_plain_run(runs):
    plain, spec = runs["runs"][2], runs["runs"][3]
    assert "ngram" in runs.log.lower()
    assert _first_differences(spec["token_ids"], plain["token_ids"]) == {}
    assert _first_differences(spec["alone_token_ids"], plain["token_ids"]) == {}


@pytest.mark.parametrize(("env", "want"), [({}, "0"), ({"VLLM_CPU_ATTN_SPLIT_KV": "1"}, "1")])
def test_the_split_is_off_unless_the_user_sets_it(monkeypatch, env, want):
    import vllm.config  # noqa: F401 - vLLM's platforms imported first, as when vLLM loads the plugin

    from omni_platform.platform import OmniPlatform

    monkeypatch.delenv("VLLM_CPU_ATTN_SPLIT_KV", raising=False)
    monkeypatch.setenv("OMNI_AUTO_SET", "")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    OmniPlatform._configure_attention_kv_split()
    assert os.environ["VLLM_CPU_ATTN_SPLIT_KV"] == want
