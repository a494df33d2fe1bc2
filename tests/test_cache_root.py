"""C21: vLLM's cache root (``VLLM_CACHE_ROOT``, and ``HOME`` under it) cannot be written.

Compiled ``vllm.LLM`` starts and serves with one warning naming the directory (caching in a private directory,
compile caching off); ``omni-vllm serve FILE.gguf`` converts into that private directory and serves, saying
that every start converts again. Never a traceback."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from readonly_dir import read_only

from conftest import clean_env, run_engine
from omni_platform.cache_root import OWNER, PREFIX, ensure_writable, sweep, write_problem

WARNING = "omni: vLLM's cache root"


def test_write_problem_names_the_directory_and_the_error(tmp_path):
    assert write_problem(tmp_path / "new" / "dirs") is None and (tmp_path / "new" / "dirs").is_dir()
    assert not list((tmp_path / "new" / "dirs").iterdir()), "the probe file is removed"
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        why = write_problem(ro / "cache")
    assert why is not None and str(ro) in why


def test_sweep_removes_only_private_directories_whose_owner_is_gone(tmp_path):
    """A server killed by SIGKILL leaves its private directory (no atexit): the next start's sweep removes it."""
    import subprocess
    import time

    import psutil

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_started = psutil.Process(dead.pid).create_time() if psutil.pid_exists(dead.pid) else time.time()
    dead.wait()
    dirs = {name: tmp_path / f"{PREFIX}{name}" for name in ("alive", "dead", "unowned-old", "unowned-new")}
    for d in dirs.values():
        (d / "omni" / "gguf").mkdir(parents=True)
        (d / "omni" / "gguf" / "weights.bin").write_bytes(b"\0" * 4096)
    (dirs["alive"] / OWNER).write_text(f"{os.getpid()} {psutil.Process().create_time()}")
    (dirs["dead"] / OWNER).write_text(f"{dead.pid} {dead_started}")
    old = time.time() - 7200
    os.utime(dirs["unowned-old"], (old, old))
    (tmp_path / "not-ours").mkdir()
    assert sorted(sweep(tmp_path)) == sorted([dirs["dead"], dirs["unowned-old"]])
    assert dirs["alive"].is_dir() and dirs["unowned-new"].is_dir() and (tmp_path / "not-ours").is_dir()
    assert not dirs["dead"].exists() and not dirs["unowned-old"].exists()


def test_ensure_writable_redirects_only_an_unwritable_root(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "ok"))
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "0")  # recorded, so the value set below is undone
    assert ensure_writable() is None and os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "ok")
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "0"
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        monkeypatch.setenv("VLLM_CACHE_ROOT", str(ro))
        private = ensure_writable()
    assert private is not None and os.environ["VLLM_CACHE_ROOT"] == str(private)
    assert os.environ["VLLM_DISABLE_COMPILE_CACHE"] == "1" and write_problem(private) is None


@pytest.mark.engine
def test_c21_compiled_llm_starts_with_an_unwritable_cache_root(int4_model_dir, tmp_path):
    ro = tmp_path / "home"
    ro.mkdir()
    with read_only(ro):
        run = run_engine({"llm": {"model": str(int4_model_dir), "max_model_len": 256}, "prompts": ["The sky is"],
                          "max_tokens": 8},
                         clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(ro / "vllm"), HOME=str(ro)))
    assert len(run["token_ids"][0]) == 8
    assert run.log.count(WARNING) == 1, run.log[-3000:]
    assert f"{WARNING} {ro / 'vllm'} cannot be written" in run.log
    assert "Traceback" not in run.log and "PermissionError" not in run.log


@pytest.mark.engine
def test_c21_serve_gguf_converts_into_a_private_directory_and_serves(tmp_path):
    """The same rule as the compiled vllm.LLM above: the conversion goes to the private directory, the server
    answers, and the directory is gone after it stops."""
    from harness.models.registry import gguf_path
    from harness.server_process import Server

    ro = tmp_path / "home"
    ro.mkdir()
    gguf = gguf_path("smollm2-135m")
    with read_only(ro):
        def cmd(port: int) -> list[str]:
            return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(gguf), "--port", str(port),
                    "--enforce-eager", "--max-model-len", "256", "--served-model-name", "m"]

        # TMPDIR short: vLLM puts its engine's ZeroMQ ipc sockets there, and a socket path must fit the
        # 107 bytes of sockaddr_un.sun_path (pytest's tmp_path on CI does not)
        tmp = Path(tempfile.mkdtemp(prefix="c21-", dir="/tmp"))
        env = clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(ro / "vllm"), HOME=str(ro), TMPDIR=str(tmp))
        try:
            with Server.start(cmd, tmp_path / "serve.log", env=env, timeout_s=900) as server:
                from harness.server_process import post_json

                out = post_json(server.base + "/v1/completions", {"model": "m", "prompt": "The sky is",
                                                                    "max_tokens": 4, "temperature": 0}, 300)
                private = [p for p in tmp.iterdir() if p.name.startswith("omni-vllm-cache-")]
                assert len(private) == 1 and any(private[0].rglob("config.json")), private
            removed_at_exit = not private[0].exists()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert out["usage"]["completion_tokens"] == 4
    assert log.count(WARNING) == 1 and f"{WARNING} {ro / 'vllm'} cannot be written" in log, log[-3000:]
    assert f"omni-vllm serve: {gguf.name} is converted into {private[0]}, removed at exit" in log
    # vLLM 0.28's own shutdown (mode=abort, timeout 0 s) may log EngineDeadError from its output handler
    # once the engine core is killed: only what comes before the shutdown is ours to keep clean
    assert "Traceback" not in log.split("[shutdown] API server: shutdown triggered")[0] and removed_at_exit
