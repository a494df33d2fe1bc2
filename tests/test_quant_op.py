"""The custom op torch.ops.omni_quant.cpu_int4_linear against dequantize-then-matmul."""

import pytest
import torch

from omni_quant.ops import cpu_int4_linear, register_ops
from omni_quant.quant_math import quantize, reference_linear


def _packed(n, k, g, dtype):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * k + g))
    q, s, z = quantize(w, g, dtype)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    return q, s, z, packed, torch.stack([s.T, z.T], dim=-1).contiguous()


@pytest.mark.parametrize("m", [1, 2, 7, 64, 512])
@pytest.mark.parametrize("n,k,g", [(1536, 576, 64), (576, 1536, 128), (96, 128, 32)])
def test_matches_reference(m, n, k, g):
    q, s, z, packed, sz = _packed(n, k, g, torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    got = cpu_int4_linear(x, packed, sz, g, bias)
    want = reference_linear(x, q, s, z, bias)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=0.05 * want.float().abs().max().item() / 10 + 0.05,
                               rtol=0.02)


def test_leading_dims_and_float32():
    q, s, z, packed, sz = _packed(64, 128, 32, torch.float32)
    x = torch.randn(2, 3, 128)
    got = cpu_int4_linear(x, packed, sz, 32)
    torch.testing.assert_close(got, reference_linear(x, q, s, z), atol=1e-3, rtol=1e-3)


def test_registering_twice_is_harmless_and_fake_impl_gives_shapes():
    register_ops()
    register_ops()
    q, s, z, packed, sz = _packed(48, 64, 32, torch.bfloat16)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.randn(5, 64, dtype=torch.bfloat16))
        out = torch.ops.omni_quant.cpu_int4_linear(fx, mode.from_tensor(packed), mode.from_tensor(sz), 32)
    assert tuple(out.shape) == (5, 48)


def test_compiles_with_torch_compile():
    q, s, z, packed, sz = _packed(64, 128, 64, torch.bfloat16)
    fn = torch.compile(lambda x: torch.ops.omni_quant.cpu_int4_linear(x, packed, sz, 64) * 2, backend="eager",
                       fullgraph=True)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    torch.testing.assert_close(fn(x), cpu_int4_linear(x, packed, sz, 64) * 2)
