"""The first ``omni-vllm serve`` of a configuration serves eager while a background process compiles it; later
starts load the compiled artifact (omni_platform/compile_ahead.py, issue 47).

Unit tests: what the configuration key ignores and what it does not, when the plan leaves the command
alone, and a background compile that fails (a model that does not exist) writing no marker. The engine
test starts the real SmolLM2 int4 server twice from an empty cache."""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env
from omni_platform.compile_ahead import config_key, plan

BASE = ["omni-vllm", "serve", "/models/m", "--max-model-len", "2048"]


def test_the_key_ignores_address_and_names_but_not_what_reaches_the_engine(monkeypatch):
    monkeypatch.delenv("OMNI_FUSED_LAYERS", raising=False)
    k = config_key(BASE, None)
    assert config_key([*BASE, "--port", "8001", "--host=0.0.0.0", "--served-model-name", "x"], None) == k
    assert config_key([*BASE, "--max-num-seqs", "4"], None) != k
    assert config_key(["omni-vllm", "serve", "/models/m", "--max-model-len", "4096"], None) != k
    monkeypatch.setenv("OMNI_FUSED_LAYERS", "0")
    assert config_key(BASE, None) != k


def test_the_users_compile_choice_and_a_disabled_cache_are_left_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    for extra in (["--enforce-eager"], ["-O0"], ["--compilation-config", "{}"], ["-cc.mode=0"]):
        p = plan([*BASE, *extra], None)
        assert p.argv == [*BASE, *extra] and p.child is None and "the user's" in p.reason
    monkeypatch.setenv("OMNI_COMPILE_AHEAD", "0")
    assert plan(BASE, None).reason == "OMNI_COMPILE_AHEAD=0"
    monkeypatch.delenv("OMNI_COMPILE_AHEAD")
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    assert "VLLM_DISABLE_COMPILE_CACHE" in plan(BASE, None).reason
    assert plan(["omni-vllm", "chat"], None).argv == ["omni-vllm", "chat"]
    assert not (tmp_path / "omni_compile_ahead").exists()


def test_a_marked_configuration_starts_compiled(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    marker = tmp_path / "omni_compile_ahead" / f"{config_key(BASE, None)}.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    p = plan(BASE, None)
    assert p.argv == BASE and p.child is None and "made before" in p.reason


def test_a_failed_background_compile_writes_no_marker_and_names_why(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    argv = ["omni-vllm", "serve", str(tmp_path / "no-such-model"), "--max-model-len", "64"]
    p = plan(argv, None)
    assert p.argv == [*argv, "--enforce-eager"] and p.child is not None
    assert "serving eager now" in p.reason and f"process {p.child}" in p.reason
    assert plan(argv, None).child == p.child  # a second start while it runs starts no second compile
    deadline = time.monotonic() + 300
    while (p.marker.with_suffix(".pid")).exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not p.marker.exists()
    assert "omni compile-ahead: failed, no marker written" in p.marker.with_suffix(".log").read_text()


@pytest.mark.engine
def test_the_first_start_answers_eager_and_a_later_start_loads_the_artifact(int4_model_dir, tmp_path):
    from harness.server_process import free_port, stop_group, wait_healthy

    env = clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(tmp_path / "cache"))

    def start(tag):
        port = free_port()
        log = tmp_path / f"{tag}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen([str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir),
                                     "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"],
                                    stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", 900, log)
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", headers={
                "Content-Type": "application/json"}, data=json.dumps({"model": str(int4_model_dir), "prompt": "Hello",
                                                                       "max_tokens": 8, "temperature": 0}).encode())
            with urllib.request.urlopen(req, timeout=300) as r:
                text = json.loads(r.read())["choices"][0]["text"]
        finally:
            stop_group(proc)
        return log.read_text(errors="replace"), text

    first, text1 = start("first")
    assert "compile mode: first start of this configuration: serving eager now" in first
    assert "Enforce eager set" in first and text1
    # the server's own start was busy: the background compile was stopped (omni_platform.compile_yield)
    assert "the background compile (process group" in first and "stops while this server is busy" in first
    markers = tmp_path / "cache" / "omni_compile_ahead"
    deadline = time.monotonic() + 900
    while not list(markers.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(2)
    (marker,) = markers.glob("*.json")
    assert json.loads(marker.read_text())["seconds"] > 0
    second, text2 = start("second")
    assert "compile mode: compiled artifact made before" in second
    assert "Enforce eager set" not in second
    assert "warming up the compiled model from its AOT artifact" in second  # loaded, not compiled again
    assert text2
    assert os.path.exists(marker)


def test_the_harness_waits_for_a_background_compile_to_exit(tmp_path, monkeypatch):
    """harness.arms.server.wait_for_compile_ahead: a process named by a pid file under the marker directory is
    waited for until it exits; none running: no wait."""
    import subprocess
    import sys

    from harness.arms.server import wait_for_compile_ahead

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    root = tmp_path / "omni_compile_ahead"
    root.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    (root / "k.pid").write_text(str(child.pid))
    got = wait_for_compile_ahead(timeout_s=60)
    child.wait()
    assert got["pids"] == [child.pid] and got["waited_s"] >= 1.0
    assert wait_for_compile_ahead(timeout_s=60)["waited_s"] < 0.5
