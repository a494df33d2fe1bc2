"""harness.models: the real model offline, and its bad inputs."""

import json
import shutil
import subprocess
import sys

import pytest

from harness import models
from harness.models import MANIFEST, ModelError, convert_gguf, fetch, gguf_path


def test_unknown_name_is_a_clear_error_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.models", "fetch", "llama-9000"],
                          capture_output=True, text=True, cwd=models.REPO_ROOT)
    assert proc.returncode == 2
    assert "unknown model 'llama-9000'" in proc.stderr and "smollm2-135m" in proc.stderr


def test_path_gguf_prints_the_shipped_file():
    proc = subprocess.run([sys.executable, "-m", "harness.models", "path", "smollm2-135m", "--gguf"],
                          capture_output=True, text=True, cwd=models.REPO_ROOT)
    assert proc.returncode == 0
    assert proc.stdout.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_fetch_is_idempotent_and_has_a_manifest(real_model):
    manifest = json.loads((real_model / MANIFEST).read_text())
    assert manifest["source"]["sha256"] and len(manifest["source"]["sha256"]) == 64
    assert manifest["tools"]["transformers"]
    assert json.loads((real_model / "config.json").read_text())["tie_word_embeddings"] is True
    before = (real_model / "model.safetensors").stat().st_mtime_ns
    assert fetch("smollm2-135m") == real_model
    assert (real_model / "model.safetensors").stat().st_mtime_ns == before


def test_fetch_path_prints_directory_as_last_line(real_model):
    proc = subprocess.run([sys.executable, "-m", "harness.models", "fetch", "smollm2-135m"],
                          capture_output=True, text=True, cwd=models.REPO_ROOT)
    assert proc.returncode == 0
    assert proc.stdout.strip().splitlines()[-1] == str(real_model)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_gguf_leaves_nothing_that_looks_complete(tmp_path, damage):
    src = gguf_path("smollm2-135m")
    bad = tmp_path / "src" / "model.gguf"
    bad.parent.mkdir()
    if damage == "truncated":
        with open(src, "rb") as f:
            bad.write_bytes(f.read(src.stat().st_size // 2))
    elif damage == "garbage":
        bad.write_bytes(b"not a gguf file at all" * 1000)
    else:
        bad.write_bytes(b"")
    out = tmp_path / "cache" / "m-bf16"
    with pytest.raises(ModelError, match=str(bad)):
        convert_gguf(bad, out, name="m")
    assert not out.exists()
    leftovers = list((tmp_path / "cache").iterdir()) if (tmp_path / "cache").exists() else []
    assert leftovers == []


def test_incomplete_cache_directory_is_rebuilt(tmp_path, real_model):
    cache = tmp_path / "cache"
    stale = cache / "smollm2-135m-bf16"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # looks like a checkpoint, but has no manifest
    with pytest.raises(ModelError, match="not fetched") as err:
        models.checkpoint_dir("smollm2-135m", cache)
    assert f"--cache-dir {cache}" in str(err.value), "the hint fetches into the same cache"
    shutil.copytree(real_model, stale, dirs_exist_ok=True)  # a complete one is accepted as is
    assert models.checkpoint_dir("smollm2-135m", cache) == stale
