"""GGUF's 4-bit blocks in cpu_int4's form (omni_quant.gguf_blocks): the codes and the group constants,
dequantized, equal what the gguf package (llama.cpp's formulas) makes of the same bytes."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, dequantize, quantize

from omni_quant.gguf_blocks import to_cpu_int4


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
