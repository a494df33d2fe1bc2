"""The 8-bit weight-only path of the recipes: quantize_int8's error bound and the linear against its reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_quant.format.quant_math import dequantize_int8, quantize_int8, sqnr_db
from omni_quant.runtime.torch_int4 import cpu_int8_linear


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 48), st.integers(1, 96), st.sampled_from([1e-3, 1.0, 1e3]), st.integers(0, 2**31 - 1))
def test_error_is_at_most_half_a_step_of_the_stored_scale(n, k, magnitude, seed):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * magnitude
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == (n, k) and s.shape == (n,) and s.dtype == torch.bfloat16
    assert int(q.abs().max()) <= 127
    err = (dequantize_int8(q, s) - w).abs()
    # bf16 rounding of the scale can push a row's extreme past 127 steps: then it clamps by < 1% of the range
    bound = 0.5 * s.float().unsqueeze(1) + w.abs().amax(1, keepdim=True) * 2 ** -8
    assert bool((err <= bound + 1e-12).all())


def test_an_all_zero_row_stays_zero_and_gaussian_weights_reach_40_db():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    w[3] = 0
    q, s = quantize_int8(w)
    assert float(s[3]) == 1.0 and not bool(q[3].any())
    assert sqnr_db(w, dequantize_int8(q, s)) > 40.0


@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("n,k", [(1536, 576), (96, 128)])
def test_linear_matches_x_times_the_dequantized_transpose(m, n, k):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    q, s = quantize_int8(w)
    x = torch.randn(m, k, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(m))
    bias = torch.randn(n, dtype=torch.bfloat16)
    got = cpu_int8_linear(x.reshape(1, m, k), q, s, bias)
    want = (x.float() @ dequantize_int8(q, s).T + bias.float()).reshape(1, m, n)
    assert got.shape == (1, m, n) and got.dtype == torch.bfloat16
    assert sqnr_db(want, got) > 35.0  # bf16 output rounding: about 48 dB


def test_float32_activations_are_cast_to_the_scales_dtype_and_back():
    q, s = quantize_int8(torch.randn(32, 64))
    x = torch.randn(5, 64)
    got = cpu_int8_linear(x, q, s)
    assert got.dtype == torch.float32 and sqnr_db(x @ dequantize_int8(q, s).T, got) > 35.0
