"""omni's speculation setting (issue 33): off by default, ``OMNI_SPECULATION=auto`` opts in; its condition, its
log line and its overrides.

With ``OMNI_SPECULATION=auto``, on a small machine an engine given no speculative config gets prompt lookup
(vLLM's ``ngram``) at batch size 1 (``omni_platform/speculation.py``, applied by
``_patch_cpu_speculation_default``); a speculative config of the user's own overrides it. Unset, the engine does
not speculate (docs/speculation.md says why). The engine tests use the real SmolLM2 int4, eager.
"""

import pytest

from conftest import clean_env, run_engine
from omni_platform import speculation

MiB = 1 << 20
SMALL = {"physical_cores": 2, "few_cpus": 4, "mode": "auto", "user_config": False, "logits_processors": False,
         "runner_type": "generate"}


def test_a_small_machine_with_nothing_chosen_speculates():
    assert speculation.why_not(**SMALL) is None


@pytest.mark.parametrize(("change", "reason"), [
    ({"mode": "off"}, "OMNI_SPECULATION=off (the default; OMNI_SPECULATION=auto opts in)"),
    ({"user_config": True}, "the engine arguments name a speculative config"),
    ({"logits_processors": True}, "custom logits processors"),
    ({"runner_type": "pooling"}, "runs as 'pooling'"),
    ({"physical_cores": 16}, "16 physical cores > OMNI_FEW_CPUS=4"),
])
def test_each_reason_against_the_default_is_named(change, reason):
    assert reason in speculation.why_not(**{**SMALL, **change})


def test_the_default_speculates_at_batch_size_one_only_in_a_schedule_vllm_accepts():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    cfg = speculation.default_speculative_config(8)
    k = speculation.CHOSEN["num_speculative_tokens"]
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens"] == k
    lookup = build_dynamic_sd_schedule_lookup(cfg["num_speculative_tokens_per_batch_size"], 8, k)
    assert lookup[1:] == [k] + [0] * 7
    assert speculation.default_speculative_config(None)["num_speculative_tokens_per_batch_size"][-1] == [2, 2, 0]
    assert cfg is not speculation.default_speculative_config(8)  # a new dict: vLLM mutates what it is given


def _llm(model, **kw):
    return {"model": str(model), "enforce_eager": True, "max_model_len": 512, "max_num_seqs": 4,
            "kv_cache_memory_bytes": 128 * MiB, **kw}


@pytest.fixture(scope="module")
def default_on(int4_model_dir):
    user = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    prompts = ["List the numbers from 1 to 30, separated by commas: 1, 2, 3,", "Once upon a time"]
    return run_engine({"runs": [
        {"llm": _llm(int4_model_dir), "prompts": prompts, "max_tokens": 48, "spec_counters": True,
         "also_alone": True},
        {"llm": _llm(int4_model_dir, speculative_config=user), "prompts": prompts, "max_tokens": 48},
        {"llm": _llm(int4_model_dir), "prompts": prompts[:1], "max_tokens": 48, "temperature": 0.8, "seed": 7,
         "repeat": True, "spec_counters": True},
    ]}, clean_env(VLLM_PLUGINS="omni", OMNI_SPECULATION="auto"))


@pytest.fixture(scope="module")
def default_off(int4_model_dir):
    prompts = ["List the numbers from 1 to 30, separated by commas: 1, 2, 3,", "Once upon a time"]
    return run_engine({"llm": _llm(int4_model_dir), "prompts": prompts, "max_tokens": 48},
                      clean_env(VLLM_PLUGINS="omni"))  # OMNI_SPECULATION unset: the default, off


@pytest.mark.engine
def test_with_auto_an_engine_without_a_speculative_config_speculates_and_says_so(default_on, default_off):
    default, user, _ = default_on["runs"]
    k = speculation.CHOSEN["num_speculative_tokens"]
    assert default["speculative"] == {"method": "ngram", "num_speculative_tokens": k,
                                      "num_speculative_tokens_per_batch_size": [[1, 1, k], [2, 4, 0]]}
    assert "speculative decoding (OMNI_SPECULATION=auto)" in default_on.log and "OMNI_SPECULATION=off" in default_on.log
    assert default["spec_counters"]["drafts"] > 0  # alone, at batch size 1, it drafted
    # greedy tokens: the same speculated alone, together (batch 2: no drafts), and not speculated at all
    assert default["token_ids"] == default["alone_token_ids"] == default_off["token_ids"]


@pytest.mark.engine
def test_a_speculative_config_of_the_users_own_wins(default_on):
    user = default_on["runs"][1]
    assert user["speculative"]["num_speculative_tokens"] == 2
    assert user["speculative"]["num_speculative_tokens_per_batch_size"] is None


@pytest.mark.engine
def test_by_default_the_engine_does_not_speculate(default_off):
    assert default_off["speculative"] is None
    assert "no speculative decoding by default: OMNI_SPECULATION=off (the default" in default_off.log


@pytest.mark.engine
def test_a_seeded_sampled_request_repeats_its_tokens_under_auto(default_on):
    sampled = default_on["runs"][2]
    assert sampled["speculative"]["method"] == "ngram" and sampled["spec_counters"]["drafts"] > 0
    assert sampled["token_ids"] == sampled["repeat_token_ids"]
