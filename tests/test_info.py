"""omni-info: exit codes and what it reports (no engine unless --worker)."""

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import skips
from conftest import clean_env

OMNI_INFO = str(Path(sys.executable).with_name("omni-info"))


def _info(*args, prefix=(), **env):
    proc = subprocess.run([*prefix, OMNI_INFO, "--json", *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)  # stdout is the report alone; vLLM logs to stderr
    return proc.returncode, report


def test_consistent_install_exits_0():
    rc, report = _info(VLLM_PLUGINS="omni")
    assert rc == 0, report["problems"]
    assert report["platform"] == "omni_platform.platform.OmniPlatform"
    assert report["distributions"] == {d: metadata.version(d) for d in ("omni-platform", "omni-quant", "omni-patches")}
    assert report["extensions_active"] == ["patches", "quant"]


def test_unknown_plugin_name_exits_1():
    rc, report = _info(VLLM_PLUGINS="omni,omnni")
    assert rc == 1
    assert any("'omnni'" in p for p in report["problems"])


def test_plugins_list_without_omni_says_vllm_runs_stock():
    rc, report = _info(VLLM_PLUGINS="")
    assert rc == 0, report["problems"]  # stock vLLM is a legitimate choice, said once
    assert "does not name 'omni'" in report["omni_off_reason"] and not report["omni_general_plugin_enabled"]
    rc, report = _info(VLLM_PLUGINS="omni")
    assert report["omni_off_reason"] is None


def test_extensions_without_omni_platform_exit_1():
    # VLLM_TARGET_DEVICE=cpu makes vLLM pick its stock CpuPlatform without asking plugins.
    rc, report = _info(VLLM_PLUGINS="omni", VLLM_TARGET_DEVICE="cpu")
    assert rc == 1
    assert report["platform"] == "vllm.platforms.cpu.CpuPlatform"
    assert "not omni_platform.platform.OmniPlatform" in report["extensions_error"]


@pytest.mark.engine
def test_c02_worker_decodes_on_all_allowed_cpus():
    """C02: default binding on this machine uses every allowed CPU, none reserved."""
    import os

    allowed = sorted(os.sched_getaffinity(0))
    rc, report = _info("--worker", VLLM_PLUGINS="omni")
    assert rc == 0, report["problems"]
    (worker,) = report["workers"]
    assert worker["platform"] == "omni_platform.platform.OmniPlatform"
    assert set(worker["threads_cpus"]) <= set(allowed) and worker["torch_threads"] == len(worker["threads_cpus"])
    # vLLM's own reservation applies on bigger machines, not omni's small-machine rule
    skips.MORE_CPUS_THAN_FEW.skip_if_holds()
    assert worker["threads_cpus"] == allowed
    assert worker["torch_threads"] == len(allowed)


@pytest.mark.engine
def test_worker_probe_under_stock_vllm_takes_a_small_kv_cache():
    """No omni platform (VLLM_PLUGINS names none of ours): the probe engine gets PROBE_KV_BYTES, not
    vLLM's CPU default (most of the node's memory), and the report says the worker is not OmniPlatform."""
    from omni_platform.testing import PROBE_KV_BYTES

    rc, report = _info("--worker", VLLM_PLUGINS="none")
    assert rc == 1
    (worker,) = report["workers"]
    assert worker["platform"] == "vllm.platforms.cpu.CpuPlatform"
    assert worker["kv_cache"]["bytes"] == PROBE_KV_BYTES


@pytest.mark.engine
def test_c02_taskset_one_cpu_means_one_thread_on_that_cpu():
    import os

    cpu = max(os.sched_getaffinity(0))
    rc, report = _info("--worker", prefix=("taskset", "-c", str(cpu)), VLLM_PLUGINS="omni")
    assert rc == 0, report["problems"]
    (worker,) = report["workers"]
    assert worker["threads_cpus"] == [cpu]
    assert worker["torch_threads"] == 1
    assert worker["omp_env"]["OMP_NUM_THREADS"] == "1"


def test_invalid_or_unknown_omni_settings_exit_1():
    rc, report = _info(VLLM_PLUGINS="omni", OMNI_KV_CACHE_MAX_FRACTION="abc")
    assert rc == 1 and any("OMNI_KV_CACHE_MAX_FRACTION='abc'" in p for p in report["problems"])
    rc, report = _info(VLLM_PLUGINS="omni", OMNI_KV_CACHE_MAX_FRAC="0.3")
    assert rc == 1 and any("OMNI_KV_CACHE_MAX_FRAC is set but is no omni setting" in p for p in report["problems"])


def test_invalid_switch_value_is_a_problem_not_a_crash():
    rc, report = _info(VLLM_PLUGINS="omni", OMNI_PATCH_KV_CACHE_OFF="maybe")
    assert rc == 1
    assert report["problems"] == [p for p in report["problems"] if "OMNI_PATCH_KV_CACHE_OFF='maybe'" in p] != []
    assert report["extensions_error"] and "maybe" in report["extensions_error"]
