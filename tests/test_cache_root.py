"""C21: vLLM's cache root (``VLLM_CACHE_ROOT``, and ``HOME`` under it) cannot be written.

Compiled ``vllm.LLM`` starts and serves with one warning naming the directory (caching in a private directory,
compile caching off); ``omni-vllm serve FILE.gguf`` refuses in one line naming the directory and a writable
one. Never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from readonly_dir import read_only

from conftest import clean_env, run_engine
from omni_platform.cache_root import ensure_writable, write_problem

WARNING = "omni: vLLM's cache root"


def test_write_problem_names_the_directory_and_the_error(tmp_path):
    assert write_problem(tmp_path / "new" / "dirs") is None and (tmp_path / "new" / "dirs").is_dir()
    assert not list((tmp_path / "new" / "dirs").iterdir()), "the probe file is removed"
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        why = write_problem(ro / "cache")
    assert why is not None and str(ro) in why


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


def test_c21_serve_gguf_refuses_an_unwritable_cache_root_in_one_line(tmp_path):
    ro = tmp_path / "home"
    ro.mkdir()
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")  # refused before it is read
    with read_only(ro):
        out = subprocess.run([str(Path(sys.executable).with_name("omni-vllm")), "serve", str(gguf), "--port", "0"],
                             env=clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(ro / "vllm"), HOME=str(ro)),
                             capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("omni-vllm serve:")]
    assert len(lines) == 1, out.stderr[-2000:]
    assert f"model.gguf is converted once into vLLM's cache root {ro / 'vllm'}" in lines[0]
    assert "set VLLM_CACHE_ROOT to a writable directory (for example VLLM_CACHE_ROOT=" in lines[0]
    assert "Traceback" not in out.stderr
