"""The cpu_int4 linear (aten._weight_int4pack_mm_for_cpu) against dequantize-then-matmul, eager and inductor."""

import pytest
import torch

from omni_quant.format.quant_math import quantize, reference_linear, sqnr_db
from omni_quant.runtime.torch_int4 import cpu_int4_linear


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


def test_inductor_calls_the_aten_kernel_directly_with_no_python_op():
    """Inductor (not the eager backend) compiles the linear into a direct extern call of the C++ kernel."""
    from torch._inductor.utils import run_and_get_code

    q, s, z, packed, sz = _packed(256, 512, 64, torch.bfloat16)
    bias = torch.randn(256, dtype=torch.bfloat16)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: cpu_int4_linear(x, packed, sz, 64, bias) * 2, backend="inductor", fullgraph=True)
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    got, codes = run_and_get_code(fn, x)
    code = "\n".join(codes)
    assert "_weight_int4pack_mm_for_cpu" in code, code
    assert "omni_quant" not in code and "direct_register_custom_op" not in code, code
    want = reference_linear(x, q, s, z, bias) * 2
    assert sqnr_db(want, got) > 30.0
