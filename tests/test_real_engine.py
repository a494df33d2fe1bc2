"""The real model in the real process layout (front end, engine core, worker)."""

import json
import re

import pytest
from omni_platform import PLATFORM_QUALNAME as OMNI
from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

PROMPTS = [
    "Once upon a time",
    "The three primary colors are",
    "def fibonacci(n):",
]
MiB = 1 << 20


@pytest.fixture(scope="module")
def default_run(real_model, tmp_path_factory):
    """OmniPlatform with vLLM's default settings (eager only), activation log on, and
    VLLM_PLUGINS unset: omni activates all the same."""
    log = tmp_path_factory.mktemp("activation") / "activation.jsonl"
    config = {"llm": {"model": str(real_model), "enforce_eager": True}, "prompts": PROMPTS[:1], "max_tokens": 16}
    run = run_engine(config, clean_env(OMNI_ACTIVATION_LOG=str(log)))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return run, records


def test_general_plugin_ran_in_front_end_engine_core_and_worker(default_run):
    run, records = default_run
    by_pid = {r["pid"]: r for r in records}
    front = by_pid[run["pid"]]
    (worker,) = run["workers"]
    assert worker["platform"] == OMNI
    engine_core = by_pid[worker["ppid"]]
    assert engine_core["ppid"] == front["pid"], "the worker's parent is a child of the front end"
    assert engine_core["process_name"] == "EngineCore"
    assert worker["pid"] in by_pid
    for r in (front, engine_core, by_pid[worker["pid"]]):
        assert r["platform"] == OMNI
        assert r["extensions"] == ["patches", "quant"]
    assert worker["extensions"] == ["patches", "quant"]


def test_c03_default_settings_start_with_a_sized_kv_cache(default_run):
    """C03: the node reports less memory than the machine; stock defaults refuse to start."""
    run, _ = default_run
    m = re.search(r"omni: kv_cache_memory_bytes=(\d+) \((\d+) blocks\) sized from max_model_len=8192 "
                  r"x max_num_seqs=256", run.log)
    assert m, "the log says how the KV budget was sized"
    (worker,) = run["workers"]
    assert worker["kv_cache"]["num_blocks"] == int(m.group(2))
    assert worker["kv_cache"]["bytes"] == int(m.group(1))
    assert run["texts"][0].strip(), "it generated text"


@pytest.fixture(scope="module")
def same_settings():
    """Settings both arms share so that only the platform differs."""
    return dict(
        env=dict(VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_NUM_OF_RESERVED_CPU="0"),
        llm=dict(enforce_eager=True, kv_cache_memory_bytes=256 * MiB, max_model_len=512, seed=0),
    )


def test_greedy_64_tokens_equal_stock_vllm(real_model, same_settings):
    """In bf16 the overlay changes no numerics: token-for-token equal to stock vLLM."""
    config = {"llm": {"model": str(real_model), **same_settings["llm"]}, "prompts": PROMPTS, "max_tokens": 64}
    omni = run_engine(config, clean_env(VLLM_PLUGINS="omni", **same_settings["env"]))
    stock = run_engine(config, clean_env(VLLM_PLUGINS="", **same_settings["env"]))
    assert omni["workers"][0]["platform"] == OMNI
    assert "Platform plugin omni is activated" not in stock.log
    assert all(len(t) == 64 for t in omni["token_ids"])
    assert omni["token_ids"] == stock["token_ids"]
