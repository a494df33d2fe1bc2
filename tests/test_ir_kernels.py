"""omni's CPU providers for vLLM IR ops agree with vLLM's native implementation."""

import pytest
import torch

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def ops():
    from vllm import ir

    import omni_platform.ir_kernels  # noqa: F401  (registers the omni_cpu providers)

    return ir.ops


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(1, 576), (7, 576), (64, 1536), (3, 5, 128)])
def test_rms_norm_matches_native(ops, dtype, atol, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[-1], dtype=dtype)
    impl = ops.rms_norm.impls["omni_cpu"]
    assert impl.supported
    assert impl.supports_args(x, w, 1e-5)
    got = impl.impl_fn(x, w, 1e-5)
    want = ops.rms_norm.impls["native"].impl_fn(x, w, 1e-5)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=atol)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", [(1, 576), (9, 576), (64, 1536)])
def test_fused_add_rms_norm_matches_native(ops, dtype, atol, shape):
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=dtype)
    r = torch.randn(shape, dtype=dtype)
    w = torch.randn(shape[-1], dtype=dtype)
    want_out, want_res = ops.fused_add_rms_norm.impls["native"].impl_fn(x.clone(), r.clone(), w, 1e-5)
    xi, ri = x.clone(), r.clone()
    got_out, got_res = ops.fused_add_rms_norm.impls["omni_cpu"].impl_fn(xi, ri, w, 1e-5)
    torch.testing.assert_close(got_res, want_res, atol=atol, rtol=atol)
    torch.testing.assert_close(got_out, want_out, atol=atol, rtol=atol)


def test_variance_size_falls_back_to_native(ops):
    x = torch.randn(2, 64)
    w = torch.randn(64)
    assert not ops.rms_norm.impls["omni_cpu"].supports_args(x, w, 1e-5, 32)


def _config(mode):
    from types import SimpleNamespace

    return SimpleNamespace(compilation_config=SimpleNamespace(mode=mode))


def test_priority_follows_the_setting_then_the_compilation_mode(monkeypatch):
    """Unset: omni's C++ norms in eager mode only; OMNI_IR_CPU_NORMS=1/0 wins either way."""
    from vllm.config import CompilationMode

    from omni_platform.platform import OmniPlatform

    eager, compiled = _config(CompilationMode.NONE), _config(CompilationMode.DYNAMO_TRACE_ONCE)
    monkeypatch.delenv("OMNI_IR_CPU_NORMS", raising=False)
    assert OmniPlatform.get_default_ir_op_priority(compiled).rms_norm == ["native"]
    on = OmniPlatform.get_default_ir_op_priority(eager)
    assert on.rms_norm == ["omni_cpu", "native"] and on.fused_add_rms_norm == ["omni_cpu", "native"]
    monkeypatch.setenv("OMNI_IR_CPU_NORMS", "0")
    off = OmniPlatform.get_default_ir_op_priority(eager)
    assert off.rms_norm == ["native"] and off.fused_add_rms_norm == ["native"]
    monkeypatch.setenv("OMNI_IR_CPU_NORMS", "1")
    assert OmniPlatform.get_default_ir_op_priority(compiled).fused_add_rms_norm == ["omni_cpu", "native"]
