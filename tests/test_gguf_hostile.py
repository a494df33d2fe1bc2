"""C35: hostile and truncated GGUF files are refused in one line, within seconds and bounded memory, by
``omni-quant convert`` and ``omni-vllm serve FILE.gguf``, before the ``gguf`` package's reader trusts their header
(omni_quant.format.gguf_bounds), and nothing is left in the conversion cache."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_quant.format.gguf_bounds import GgufBoundsError, check

OMNI_QUANT = str(Path(sys.executable).with_name("omni-quant"))
OMNI_VLLM = str(Path(sys.executable).with_name("omni-vllm"))


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def huge_array(path: Path) -> Path:
    """A GGUF (version 3, no tensor) whose one metadata array of uint8 declares 2^62 elements."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"tokenizer.ggml.scores")
                     + struct.pack("<IIQ", 9, 0, 1 << 62) + b"\0" * 64)
    return path


def huge_string_array(path: Path) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _string(b"tokenizer.ggml.tokens")
                     + struct.pack("<IIQ", 9, 8, 1 << 40) + _string(b"a") * 4)
    return path


def tensor_past_the_end(tmp_path: Path) -> Path:
    """A valid one-tensor GGUF (the gguf package's writer), its tensor's dimension then patched to 2^40."""
    import gguf
    import numpy as np

    path = tmp_path / "tensor.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    assert check(path) == 1  # the file as written is fine
    info = _string(b"t") + struct.pack("<IQ", 1, 4)
    assert data.count(info) == 1
    path.write_bytes(data.replace(info, _string(b"t") + struct.pack("<IQ", 1, 1 << 40)))
    return path


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> Path:
    """SmolLM2-135M's real GGUF (the bundled model's source) cut in half."""
    from harness.models.registry import gguf_path

    src = gguf_path("smollm2-135m")
    dst = tmp_path_factory.mktemp("cut") / "smollm2-half.gguf"
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read(src.stat().st_size // 2))
    return dst


def test_the_real_gguf_passes_and_its_half_does_not(truncated):
    from harness.models.registry import gguf_path

    assert check(gguf_path("smollm2-135m")) > 0
    with pytest.raises(GgufBoundsError, match="data section holds"):
        check(truncated)


@pytest.mark.parametrize("make, words", [(huge_array, "declares an array of 4611686018427387904 elements"),
                                         (huge_string_array, "declares an array of 1099511627776 elements")])
def test_a_declared_array_past_the_files_end_is_refused_at_once(tmp_path, make, words):
    t = time.monotonic()
    with pytest.raises(GgufBoundsError, match=words):
        check(make(tmp_path / "x.gguf"))
    assert time.monotonic() - t < 5


def test_a_tensor_past_the_end_is_refused(tmp_path):
    with pytest.raises(GgufBoundsError, match="tensor 't' of shape \\[1099511627776\\]"):
        check(tensor_past_the_end(tmp_path))


def test_not_a_gguf_and_an_empty_file(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GgufBoundsError, match="magic"):
        check(tmp_path / "a.gguf")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(GgufBoundsError, match="the magic needs 4 bytes"):
        check(tmp_path / "b.gguf")


# runs the command as its only child and writes the largest resident set of its tree (KiB, getrusage) to argv[1]
PEAK = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(code)")


def _run(cmd: list[str], env: dict, tmp_path: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``cmd``; its seconds and its peak resident set (MiB, the largest of its processes)."""
    peak = tmp_path / "peak-kib"
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PEAK, str(peak), *cmd], capture_output=True, text=True, timeout=300,
                          env=env)
    return proc, time.monotonic() - t, int(peak.read_text()) / 1024


@pytest.mark.parametrize("kind", ["array", "tensor", "half"])
def test_omni_quant_convert_refuses_in_one_line(tmp_path, kind, truncated):
    from conftest import clean_env

    src = {"array": lambda: huge_array(tmp_path / "h.gguf"), "tensor": lambda: tensor_past_the_end(tmp_path),
           "half": lambda: truncated}[kind]()
    proc, seconds, peak_mib = _run([OMNI_QUANT, "convert", str(src), str(tmp_path / "out")], clean_env(), tmp_path)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a usable GGUF file" in lines[0] and src.name in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert seconds < 60 and peak_mib < 1024, (seconds, peak_mib)
    assert not (tmp_path / "out").exists()


@pytest.mark.engine
def test_omni_vllm_serve_refuses_a_hostile_gguf_in_one_line_and_caches_nothing(tmp_path):
    from conftest import clean_env
    from harness.server_process import free_port

    cache = tmp_path / "cache"
    src = huge_array(tmp_path / "hostile.gguf")
    proc, seconds, peak_mib = _run([OMNI_VLLM, "serve", str(src), "--port", str(free_port())],
                                   clean_env(VLLM_PLUGINS="omni", VLLM_CACHE_ROOT=str(cache)), tmp_path)
    assert proc.returncode != 0, proc.stderr[-2000:]
    tail = proc.stderr.strip().splitlines()[-1]
    assert "hostile.gguf" in tail and "not a usable GGUF file" in tail, proc.stderr[-2000:]
    assert seconds < 120 and peak_mib < 2048, (seconds, peak_mib)
    gguf_root = cache / "omni" / "gguf"  # the digest index and the lock may stay; no conversion, whole or partial
    leftovers = [p for p in gguf_root.iterdir() if p.is_dir()] if gguf_root.exists() else []
    assert leftovers == [], leftovers
