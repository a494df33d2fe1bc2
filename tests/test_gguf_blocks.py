"""GGUF's 4-bit blocks in cpu_int4's form (omni_quant.format.gguf_blocks): the codes and the group constants,
dequantized, equal what the gguf package (llama.cpp's formulas) makes of the same bytes."""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize, quantize

from omni_quant.format.gguf_blocks import _F16_FIELDS, stored_values_finite, to_cpu_int4


def _ours(codes, s, z):
    return (codes.astype(np.float32) - 8) * np.repeat(s, 32, axis=1) + np.repeat(z, 32, axis=1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_0_and_q4_1_match_llama_cpps_dequantization(kind):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 128)) * 0.05 + rng.standard_normal((24, 1)) * 0.02).astype(np.float32)
    t = getattr(GGMLQuantizationType, kind)
    raw = quantize(w, t)
    codes, s, z = to_cpu_int4(raw, kind, 24, 128)
    assert codes.dtype == np.uint8 and codes.max() <= 15 and s.shape == z.shape == (24, 4)
    np.testing.assert_allclose(_ours(codes, s, z), dequantize(raw, t), rtol=0, atol=1e-6)


def _random_q4_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Valid Q4_K bytes: random codes and 6-bit scales/mins, finite fp16 d and dmin."""
    rng = np.random.default_rng(seed)
    n = rows * cols // 256
    b = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
    b[:, 0:2] = rng.uniform(1e-3, 2e-2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    b[:, 2:4] = rng.uniform(1e-3, 2e-2, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return b


def test_q4_k_matches_llama_cpps_dequantization():
    raw = _random_q4_k(8, 512, 1)
    codes, s, z = to_cpu_int4(raw, "Q4_K", 8, 512)
    assert s.shape == (8, 16)
    want = dequantize(raw.reshape(8, -1), GGMLQuantizationType.Q4_K)
    np.testing.assert_allclose(_ours(codes, s, z), want, rtol=1e-6, atol=1e-6)


def test_wrong_sizes_and_types_are_named():
    with pytest.raises(ValueError, match="Q6_K is not one of the 4-bit types"):
        to_cpu_int4(np.zeros(10, np.uint8), "Q6_K", 1, 256)
    with pytest.raises(ValueError, match=r"Q4_0 \[2, 64\] needs 72 bytes, the tensor has 70"):
        to_cpu_int4(np.zeros(70, np.uint8), "Q4_0", 2, 64)
    with pytest.raises(ValueError, match="K=100 is not a multiple of its block of 32"):
        to_cpu_int4(np.zeros(10, np.uint8), "Q4_1", 1, 100)


@pytest.mark.parametrize("kind", sorted(_F16_FIELDS))
def test_stored_values_finite_reads_the_fields_llama_cpp_scales_with(kind):
    """The fp16 field offsets per block type agree with the gguf package's dequantization: finite
    fields dequantize to finite values; NaN or inf at any listed field shows in its output."""
    size, offsets = _F16_FIELDS[kind]
    t = getattr(GGMLQuantizationType, kind)
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(64, size), dtype=np.uint8)
    for at in offsets:
        blocks[:, at:at + 2] = rng.uniform(1e-3, 2e-2, 64).astype(np.float16).view(np.uint8).reshape(64, 2)
    values_per_block = 256 if kind.endswith("_K") else 32
    assert stored_values_finite(blocks, kind) is True
    assert np.isfinite(dequantize(blocks.reshape(1, -1), t)).all()
    for at in offsets:
        for bad in (np.nan, np.inf):
            b = blocks.copy()
            b[5, at:at + 2] = np.array([bad], dtype=np.float16).view(np.uint8)
            assert stored_values_finite(b, kind) is False, (kind, at)
            with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf times the codes, as intended
                out = dequantize(b.reshape(1, -1), t).reshape(64, values_per_block)
            assert not np.isfinite(out[5]).all() and np.isfinite(np.delete(out, 5, 0)).all(), (kind, at)


def test_stored_values_finite_on_float_tensors_and_unknown_types():
    x = np.ones(16, np.float32)
    assert stored_values_finite(x, "F32") and stored_values_finite(x.astype(np.float16), "F16")
    x[7] = np.inf
    assert stored_values_finite(x, "F32") is False and stored_values_finite(x.astype(np.float16), "F16") is False
    bf16 = np.array([0x3F80, 0x7FC0], dtype=np.uint16)  # 1.0, NaN
    assert stored_values_finite(bf16[:1], "BF16") is True and stored_values_finite(bf16, "BF16") is False
    assert stored_values_finite(np.zeros(66, np.uint8), "IQ2_XS") is None


def test_the_gguf_cache_is_keyed_by_the_converter_version_too(tmp_path):
    """omni-vllm serve FILE.gguf: a conversion an older converter made (the name without the version) is
    not what a newer one serves; this version's conversion is."""
    from omni_quant.conversion import gguf_cache
    from omni_quant.conversion.output import CONVERTER_VERSION

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    digest = gguf_cache._sha256(gguf)
    for name in (f"m-{digest[:16]}", f"m-{digest[:16]}-c{CONVERTER_VERSION.rsplit('/', 1)[-1]}"):
        (tmp_path / "cache" / name).mkdir(parents=True)
        (tmp_path / "cache" / name / "config.json").write_text("{}")
    out = gguf_cache.cached_conversion(gguf, tmp_path / "cache")
    assert out.name == f"m-{digest[:16]}-c{CONVERTER_VERSION.rsplit('/', 1)[-1]}"


def test_a_files_digest_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """A warm ``serve FILE.gguf`` does not read the whole file again: the digest is kept by the file's identity
    (device, inode, size, mtime); a rewritten file is read again."""
    import os

    from omni_quant.conversion import gguf_cache

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    reads = []
    real = gguf_cache._sha256
    monkeypatch.setattr(gguf_cache, "_sha256", lambda p: reads.append(p) or real(p))
    first = gguf_cache.file_digest(gguf, tmp_path / "cache")
    assert gguf_cache.file_digest(gguf, tmp_path / "cache") == first and len(reads) == 1
    gguf.write_bytes(b"GGUF" + bytes(61))
    os.utime(gguf, ns=(1, 1))
    assert gguf_cache.file_digest(gguf, tmp_path / "cache") == real(gguf) != first and len(reads) == 2
    (tmp_path / "cache" / "digests.json").write_text("not json")  # a damaged index costs only a read
    assert gguf_cache.file_digest(gguf, tmp_path / "cache") == real(gguf) and len(reads) == 3


def test_c22_two_starts_on_one_gguf_share_one_conversion(tmp_path):
    """C22: two processes resolving the same real GGUF at the same moment on an empty cache: one converts, the
    other waits on the lock and serves the finished copy (no "destination appeared while converting"). SmolLM2's
    GGUF cut to its first 2 of 30 blocks (tests/gguf_files.py): the same file format and locking, a conversion
    of seconds rather than minutes; tests/test_gguf_convert.py serves the whole file."""
    import subprocess
    import sys

    from gguf_files import fewer_layers

    from harness.models.registry import gguf_path

    gguf = fewer_layers(gguf_path("smollm2-135m"), tmp_path / "smollm2-2-blocks.gguf", 2)
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
              "from pathlib import Path; from omni_quant.conversion.gguf_cache import cached_conversion; "
              f"print(cached_conversion(Path({str(gguf)!r}), Path({str(tmp_path / 'cache')!r})))")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1 and (Path(paths.pop()) / "config.json").is_file()
    logs = "".join(o[1] for o in outs)
    assert logs.count("to cpu_int4 once, into") == 1, logs[-3000:]  # converted once
    assert "another process is converting" in logs and "is served from its cpu_int4 conversion" in logs


def test_cache_list_and_prune(tmp_path, capsys, monkeypatch):
    import os
    import time

    from omni_quant.conversion import cli, gguf_cache
    from omni_quant.conversion.output import CONVERTER_VERSION

    v = CONVERTER_VERSION.rsplit("/", 1)[-1]
    root = tmp_path / "gguf"
    for name, complete, age_days in ((f"a-0123-c{v}", True, 0), (f"b-4567-c{v}", True, 40), ("c-89ab-c1", True, 0),
                                     (f"d-cdef-c{v}", False, 0)):
        d = root / name
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(bytes(1 << 20))
        if complete:
            (d / "config.json").write_text("{}")
        t = time.time() - age_days * 86400
        os.utime(d, (t, t))
    monkeypatch.setattr(gguf_cache, "cache_root", lambda: root)
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "4 conversion(s)" in out and "older converter" in out and "incomplete" in out
    assert sorted(e.path.name for e in gguf_cache.prune(root, dry_run=True)) == ["c-89ab-c1", f"d-cdef-c{v}"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["a-0123-c" + v, "b-4567-c" + v, "c-89ab-c1",
                                                                    f"d-cdef-c{v}"]  # a dry run removes nothing
    assert cli.main(["cache", "prune", "--days", "30"]) == 0
    assert "removed 3 conversion(s)" in capsys.readouterr().out
    assert [p.name for p in root.iterdir() if p.is_dir()] == [f"a-0123-c{v}"]


def test_c36_a_damaged_conversion_is_found_listed_and_pruned(tmp_path, capsys, monkeypatch):
    """A conversion's files are recorded (size, sha256, identity) when it is made; a shard cut or rewritten
    after that is named, `omni-quant cache list` says so and `prune` removes the entry; an intact one stays."""
    import os

    from omni_quant.conversion import cli, gguf_cache
    from omni_quant.conversion.output import CONVERTER_VERSION

    v = CONVERTER_VERSION.rsplit("/", 1)[-1]
    root = tmp_path / "gguf"
    made = {}
    for name in (f"a-0123-c{v}", f"b-4567-c{v}", f"c-89ab-c{v}"):
        d = root / name
        (d / "omni-layouts").mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "model-00001.safetensors").write_bytes(bytes(range(256)) * 64)
        (d / "omni-layouts" / "x.layout").write_bytes(b"written later by the runtime: not recorded")
        made[name] = gguf_cache.record(d)
    assert set(made[f"a-0123-c{v}"]["files"]) == {"config.json", "model-00001.safetensors"}
    assert gguf_cache.damage(root / f"a-0123-c{v}") is None
    shard_b = root / f"b-4567-c{v}" / "model-00001.safetensors"
    with open(shard_b, "r+b") as f:
        f.truncate(1000)  # cut after a good start
    shard_c = root / f"c-89ab-c{v}" / "model-00001.safetensors"
    data = bytearray(shard_c.read_bytes())
    data[5] ^= 1  # rewritten in place, same size
    shard_c.write_bytes(bytes(data))
    os.utime(shard_c, ns=(1, 1))
    cut, flipped = gguf_cache.damage(root / f"b-4567-c{v}"), gguf_cache.damage(root / f"c-89ab-c{v}")
    assert cut == "model-00001.safetensors holds 1000 bytes, 16384 when it was written"
    assert flipped == "model-00001.safetensors changed since it was written (sha256 differs)"
    monkeypatch.setattr(gguf_cache, "cache_root", lambda: root)
    assert cli.main(["cache", "list"]) == 0
    assert capsys.readouterr().out.count("damaged:") == 2
    assert cli.main(["cache", "prune"]) == 0
    assert "removed 2 conversion(s)" in capsys.readouterr().out
    assert [p.name for p in root.iterdir() if p.is_dir()] == [f"a-0123-c{v}"]


def test_c36_serve_converts_a_damaged_conversion_again(tmp_path):
    """The real flow on SmolLM2's GGUF cut to 2 blocks: converted and recorded; its shard then cut; the next
    resolution names the damage, converts again and serves an intact conversion."""
    import logging

    from gguf_files import fewer_layers

    from harness.models.registry import gguf_path
    from omni_quant.conversion import gguf_cache

    gguf = fewer_layers(gguf_path("smollm2-135m"), tmp_path / "smollm2-2-blocks.gguf", 2)
    out = gguf_cache.cached_conversion(gguf, tmp_path / "cache")
    assert (out / gguf_cache.RECORD).is_file() and gguf_cache.damage(out) is None
    shard = max(out.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())
    logging.getLogger("vllm.omni_quant.gguf").addHandler(handler)
    try:
        again = gguf_cache.cached_conversion(gguf, tmp_path / "cache")
    finally:
        logging.getLogger("vllm.omni_quant.gguf").removeHandler(handler)
    assert again == out and gguf_cache.damage(again) is None
    assert any("is damaged" in m and shard.name in m and "converting" in m for m in seen), seen
