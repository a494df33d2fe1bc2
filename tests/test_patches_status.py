"""``omni-patches status --worker``: the console script, against a real engine's worker."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

OMNI_PATCHES = str(Path(sys.executable).with_name("omni-patches"))
NAMES = {"_patch_cpu_aot_compile_cache_load", "_patch_cpu_explicit_kv_cache_memory",
         "_patch_cpu_release_memory_after_load", "_patch_cpu_small_machine_batch_defaults",
         "_patch_cpu_sampler_seeds", "_patch_cpu_pipeline_parallel_eager",
         "_patch_modelinfo_cache_for_packages", "_patch_token_ids_before_verify", "_patch_cpu_embedding_gemm_copy",
         "_patch_cpu_small_warmup", "_patch_tokenizer_pool_in_background", "_patch_text_model_processor_probe",
         "_patch_cpu_modelinfo_in_process", "_patch_cpu_speculation_default", "_patch_cpu_seeded_chunked_prefill",
         "_patch_lora_on_quantized_embeddings", "_patch_cpu_spec_expand_kernel",
         "_patch_detokenizer_prompt_mid_character", "_patch_cpu_kv_cache_lazy_pages"}


def _status(*args, **env):
    proc = subprocess.run([OMNI_PATCHES, "status", "--json", *args], env=clean_env(**{"VLLM_PLUGINS": "omni", **env}),
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout), proc  # stdout is the report alone


@pytest.mark.engine
def test_status_worker_shows_every_patch_applied_in_the_worker():
    rc, report, proc = _status("--worker")
    assert rc == 0, proc.stderr[-2000:]
    assert report["vllm"] == "0.28.0" and report["error"] is None
    rows = {r["name"]: r for r in report["patches"]}
    assert set(rows) == NAMES
    for r in rows.values():
        assert (r["targets_found"], r["fingerprints_match"], r["enabled"], r["applied"], r["applied_in_worker"]) \
            == (True, True, True, True, True), r
    assert "omni-patches: applied" in proc.stderr, "vLLM's log goes to stderr"


def test_status_says_when_vllm_plugins_leaves_omni_out():
    rc, report, proc = _status(VLLM_PLUGINS="")
    assert report["omni_off_reason"] and "applied in this process only" in proc.stderr, proc.stderr[-2000:]
    rc, report, proc = _status()
    assert report["omni_off_reason"] is None and "note:" not in proc.stderr


def test_status_without_worker_starts_no_engine():
    rc, report, proc = _status()
    assert rc == 0, proc.stderr[-2000:]
    assert {r["name"] for r in report["patches"]} == NAMES
    assert all(r["applied"] and r["applied_in_worker"] is None for r in report["patches"])
    assert "EngineCore" not in proc.stderr


def test_an_invalid_switch_value_is_a_usage_error_with_json():
    rc, report, proc = _status(OMNI_PATCH_KV_CACHE_OFF="maybe")
    assert rc == 2 and report["patches"] is None
    assert "OMNI_PATCH_KV_CACHE_OFF='maybe' is invalid" in report["error"]
    assert "omni-patches: error:" in proc.stderr and "Traceback" not in proc.stderr
