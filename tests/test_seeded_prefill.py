"""A seeded, sampled request whose prompt is prefilled over several steps (chunked prefill) on the real SmolLM2
int4: vLLM 0.28's CPU runner died on it ("CPU Generator does not use offset", C32, docs/cases.md);
``_patch_cpu_seeded_chunked_prefill`` rewinds the generator's state instead. The engine keeps serving, the
request repeats its tokens, and they equal the tokens of the same request prefilled in one step."""

import pytest

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

MiB = 1 << 20
PROMPT = [100 + (i * 37) % 5000 for i in range(700)]  # 700 token ids: six chunks at a 128-token step budget


def _run(budget: int) -> dict:
    return {"llm": {"model": "", "enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 4,
                    "max_num_batched_tokens": budget, "kv_cache_memory_bytes": 128 * MiB},
            "prompts": [PROMPT, "Once upon a time"], "max_tokens": 12, "temperature": 0.8, "seed": 11,
            "repeat": True}


def test_c32_a_seeded_request_with_a_chunked_prompt_keeps_the_engine_and_its_tokens(int4_model_dir):
    runs = [_run(128), _run(1024)]
    for r in runs:
        r["llm"]["model"] = str(int4_model_dir)
    chunked, whole = run_engine({"runs": runs}, clean_env(VLLM_PLUGINS="omni"))["runs"]
    assert len(chunked["token_ids"][0]) == 12
    assert chunked["repeat_token_ids"] == chunked["token_ids"]  # seeded: the same tokens again
    assert chunked["token_ids"][0] == whole["token_ids"][0]  # the exact rewind: as if prefilled in one step


def test_c32_without_the_patch_the_seeded_chunked_prompt_kills_vllms_engine(int4_model_dir):
    run = _run(128)
    run["llm"]["model"] = str(int4_model_dir)
    with pytest.raises(AssertionError, match="CPU Generator does not use offset"):
        run_engine(run, clean_env(VLLM_PLUGINS="omni", OMNI_PATCH_SEEDED_PREFILL_OFF="1"))
