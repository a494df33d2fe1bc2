"""harness.kernels.vllm_w4a8: vLLM's W4A8 CPU kernel with cpu_int4's float zeros, against dequantize-then-matmul."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.kernels.vllm_w4a8 import repack_w4a8, w4a8_available, w4a8_linear
from omni_quant.format.quant_math import quantize, reference_linear, sqnr_db
from skips import NO_AVX512_BF16

pytestmark = NO_AVX512_BF16.mark()


def test_vllm_ships_the_kernel_on_this_cpu():
    """On an AVX-512 BF16 CPU vLLM loads its full _C library, which has the kernel: its absence fails."""
    assert w4a8_available()


@settings(max_examples=40, deadline=None)
@given(n32=st.integers(1, 8), groups=st.integers(1, 6), g=st.sampled_from([32, 64, 128]), m=st.integers(1, 70),
       seed=st.integers(0, 2**16), bias=st.booleans())
def test_matches_the_dequantized_reference(n32, groups, g, m, seed, bias):
    """SQNR >= 30 dB over shapes, row counts and group sizes: only the kernel's int8 activations differ."""
    n, k = 32 * n32, g * groups
    gen = torch.Generator().manual_seed(seed)
    q, s, z = quantize(torch.randn(n, k, generator=gen), g, torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    w = repack_w4a8(q, s, z, g)
    got = w4a8_linear(x, w.weight, w.zeros, w.scales, w.zero_t, g, b)
    want = reference_linear(x, q, s, z, b)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert sqnr_db(want, got) >= 30.0


def test_float_zero_correction_is_what_makes_it_right():
    """Large float zeros: the kernel alone (integer zero point 8) is far off; with the correction it is not."""
    n, k, g = 64, 256, 32
    gen = torch.Generator().manual_seed(1)
    q, s, z = quantize(torch.randn(n, k, generator=gen) + 3.0, g, torch.bfloat16)  # every group offset
    assert z.float().abs().mean() > 1.0
    x = torch.randn(4, k, generator=gen).to(torch.bfloat16)
    w = repack_w4a8(q, s, z, g)
    want = reference_linear(x, q, s, z)
    corrected = w4a8_linear(x, w.weight, w.zeros, w.scales, w.zero_t, g)
    kernel_only = torch.ops._C.int4_scaled_mm_cpu(x, w.weight, w.zeros, w.scales, None)
    assert sqnr_db(want, corrected) >= 30.0
    assert sqnr_db(want, kernel_only) < 10.0


def test_leading_dims_and_float32_activations():
    n, k, g = 64, 128, 64
    q, s, z = quantize(torch.randn(n, k), g, torch.bfloat16)
    w = repack_w4a8(q, s, z, g)
    x = torch.randn(2, 3, k)
    got = w4a8_linear(x, w.weight, w.zeros, w.scales, w.zero_t, g)
    assert got.shape == (2, 3, n) and got.dtype == torch.float32
    assert sqnr_db(reference_linear(x.to(torch.bfloat16), q, s, z), got) >= 30.0


def test_n_not_a_multiple_of_32_is_refused():
    q, s, z = quantize(torch.randn(48, 64), 32, torch.bfloat16)
    with pytest.raises(ValueError, match="N=48 is not a multiple of 32"):
        repack_w4a8(q, s, z, 32)


def test_inductor_compiles_it_with_the_kernel_as_an_extern_call():
    from torch._inductor.utils import run_and_get_code

    n, k, g = 64, 256, 32
    q, s, z = quantize(torch.randn(n, k), g, torch.bfloat16)
    w = repack_w4a8(q, s, z, g)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: w4a8_linear(x, w.weight, w.zeros, w.scales, w.zero_t, g), backend="inductor",
                       fullgraph=True)
    x = torch.randn(5, k, dtype=torch.bfloat16)
    got, codes = run_and_get_code(fn, x)
    assert "int4_scaled_mm_cpu" in "\n".join(codes)
    assert sqnr_db(reference_linear(x, q, s, z), got) >= 30.0
