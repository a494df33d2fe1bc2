"""omni's speculation default (issues 33 and 47): on by default on small machines (``OMNI_SPECULATION=auto``),
``OMNI_SPECULATION=off`` opts out; its condition, its log line and its overrides.

On a small machine an engine given no speculative config gets omni's gated prompt lookup (vLLM's
``custom_class`` hook, ``omni_platform/spec_proposer.py``), which drafts only while one request decodes
(``omni_platform/speculation.py``, applied by ``_patch_cpu_speculation_default``); a speculative config of the
user's own overrides it. The engine tests use the real SmolLM2 int4, eager.
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
    ({"mode": "off"}, "OMNI_SPECULATION=off"),
    ({"user_config": True}, "the engine arguments name a speculative config"),
    ({"logits_processors": True}, "custom logits processors"),
    ({"runner_type": "pooling"}, "runs as 'pooling'"),
    ({"physical_cores": 16}, "16 physical cores > OMNI_FEW_CPUS=4"),
    ({"parallel": 2}, "split over 2 workers"),
])
def test_each_reason_against_the_default_is_named(change, reason):
    assert reason in speculation.why_not(**{**SMALL, **change})


def test_the_default_is_the_gated_proposer_that_vllm_loads_through_its_custom_class_hook(monkeypatch):
    from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

    from omni_platform import envs

    cfg = speculation.default_speculative_config(8)
    assert cfg == {"method": "custom_class", "model": "omni_platform.spec_proposer.GatedPromptLookup",
                   "num_speculative_tokens": 8}
    assert cfg is not speculation.default_speculative_config(8)  # a new dict: vLLM mutates what it is given
    monkeypatch.delenv("OMNI_SPECULATION", raising=False)
    assert envs.OMNI_SPECULATION == "auto"

    class Config:  # what create_custom_proposer reads, and what the proposer reads
        speculative_config = type("S", (), {"model": cfg["model"], "num_speculative_tokens": 8})()
        model_config = type("M", (), {"max_model_len": 512})()

    proposer = create_custom_proposer(Config())
    assert type(proposer).__name__ == "GatedPromptLookup" and proposer.k_max == 8


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
    ]}, clean_env(VLLM_PLUGINS="omni"))  # OMNI_SPECULATION unset: the default, auto


@pytest.fixture(scope="module")
def default_off(int4_model_dir):
    prompts = ["List the numbers from 1 to 30, separated by commas: 1, 2, 3,", "Once upon a time"]
    return run_engine({"llm": _llm(int4_model_dir), "prompts": prompts, "max_tokens": 48},
                      clean_env(VLLM_PLUGINS="omni", OMNI_SPECULATION="off"))


@pytest.mark.engine
def test_by_default_an_engine_without_a_speculative_config_speculates_and_says_so(default_on, default_off):
    default, user, _ = default_on["runs"]
    k = speculation.CHOSEN["num_speculative_tokens"]
    assert default["speculative"] == {"method": "custom_class", "num_speculative_tokens": k,
                                      "num_speculative_tokens_per_batch_size": None}
    assert "speculative decoding (OMNI_SPECULATION=auto, the default)" in default_on.log
    assert "OMNI_SPECULATION=off" in default_on.log and "min_p and logit_bias" in default_on.log
    assert default["spec_counters"]["drafts"] > 0  # alone, at batch size 1, it drafted
    # greedy tokens: the same speculated alone, together (batch 2: no drafts), and not speculated at all
    assert default["token_ids"] == default["alone_token_ids"] == default_off["token_ids"]


@pytest.mark.engine
def test_a_speculative_config_of_the_users_own_wins(default_on):
    user = default_on["runs"][1]
    assert user["speculative"]["num_speculative_tokens"] == 2
    assert user["speculative"]["num_speculative_tokens_per_batch_size"] is None


@pytest.mark.engine
def test_off_the_engine_does_not_speculate_and_says_why(default_off):
    assert default_off["speculative"] is None
    assert "no speculative decoding by default: OMNI_SPECULATION=off" in default_off.log


@pytest.mark.engine
def test_a_seeded_sampled_request_repeats_its_tokens_under_the_default(default_on):
    sampled = default_on["runs"][2]
    assert sampled["speculative"]["method"] == "custom_class" and sampled["spec_counters"]["drafts"] > 0
    assert sampled["token_ids"] == sampled["repeat_token_ids"]
