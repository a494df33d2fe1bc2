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
         "_patch_detokenizer_prompt_mid_character", "_patch_cpu_kv_cache_lazy_pages",
         "_patch_inductor_isa_probe_cache", "_patch_inductor_triton_key_cache"}


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


def _table_rows(text: str, header: str) -> dict[str, list[str]]:
    """docs/stability.md's table under the line starting with ``header``: patch name -> its cells."""
    rows, inside = {}, False
    for line in text.splitlines():
        if line.startswith(header):
            inside = True
            continue
        if inside and line.startswith("| `_patch"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1:]
        elif inside and rows and not line.startswith("|"):
            break
    return rows


def test_docs_stability_tables_name_every_patch_its_switch_and_tests_that_exist_and_set_it():
    """Both tables of docs/stability.md have one row per patch; the patch table names the switch; every test the
    test table names exists, and the file of one of the bug tests sets the patch's switch."""
    import ast
    import re

    from conftest import REPO
    from omni_patches.patches import all_patches

    text = (REPO / "docs" / "stability.md").read_text()
    patches = {p.name: p for p in all_patches()}
    declared = _table_rows(text, "| patch | target(s) | upstream bug | switch |")
    tested = _table_rows(text, "| patch | the bug, with the switch set | its absence, with the patch on |")
    assert set(declared) == set(patches) == set(tested)
    functions: dict[str, set[str]] = {}
    for name, patch in patches.items():
        assert patch.disable_env in declared[name][-1], (name, declared[name][-1])
        bug, fix = tested[name]
        for cell in (bug, fix):
            files = re.findall(r"tests/(test_\w+\.py)(?:::(\w+))?", cell)
            assert files or cell.startswith(("the same test", "the first test")), f"{name}: no test in {cell!r}"
            for file, test in files:
                if file not in functions:
                    tree = ast.parse((REPO / "tests" / file).read_text())
                    functions[file] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
                assert not test or test in functions[file], f"{name}: tests/{file}::{test} does not exist"
        bug_files = {f for f, _ in re.findall(r"tests/(test_\w+\.py)(?:::(\w+))?", bug)}
        assert any(patch.disable_env in (REPO / "tests" / f).read_text() for f in bug_files), \
            f"{name}: no test file of its bug column sets {patch.disable_env}: {sorted(bug_files)}"
