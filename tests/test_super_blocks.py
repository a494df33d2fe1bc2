"""cpu_int4's super-block scheme (format_version 3, Q4_K's arrangement): the fit from float weights, the
GGUF Q4_K repack bit for bit, and omni's super-block kernel on every path this CPU runs against the
dequantize-then-matmul reference."""

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import skips
from omni_quant.format import super_blocks
from omni_quant.format.quant_math import dequantize, quantize, sqnr_db
from omni_quant.kernels import w4a8 as native
from skips import needs_kernel

ISAS = native.supported_isas() if native.available() else []


def _weights(n, k, seed, scale=0.05):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * scale, gen


def test_the_fit_is_as_close_as_bf16_groups_of_32_in_fewer_bits():
    """Super-blocks store 4.625 bits a weight against 5.0 for bf16 scale and zero per 32; on Gaussian and
    heavy-tailed weights the fit loses at most 0.5 dB against the per-group fit."""
    gen = torch.Generator().manual_seed(0)
    for w in (torch.randn(128, 1536, generator=gen) * 0.02,
              torch.distributions.StudentT(3.0).sample((128, 1536)) * 0.02):
        parts = super_blocks.quantize(w)
        q, s, z = quantize(w, 32, torch.bfloat16)
        assert sqnr_db(w, super_blocks.dequantize(*parts)) >= sqnr_db(w, dequantize(q, s, z, torch.float32)) - 0.5


def test_the_fit_returns_the_documented_ranges_and_dtypes():
    w, _ = _weights(32, 512, 1)
    codes, sc, mn, d, dmin = super_blocks.quantize(w)
    assert codes.shape == (32, 512) and codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert sc.shape == mn.shape == (32, 16) and sc.dtype == mn.dtype == torch.uint8
    assert int(sc.max()) <= 63 and int(mn.max()) <= 63
    assert d.shape == dmin.shape == (32, 2) and d.dtype == dmin.dtype == torch.float16
    assert bool((d >= 0).all()) and bool((dmin >= 0).all())


def test_importance_lowers_the_weighted_error():
    w, gen = _weights(64, 768, 2)
    imp = torch.rand(768, generator=gen) ** 4
    plain, weighted = super_blocks.quantize(w), super_blocks.quantize(w, importance=imp)

    def err(parts):
        return float(((super_blocks.dequantize(*parts) - w).pow(2) * imp).sum())

    assert err(weighted) < err(plain)


def test_a_positive_only_weight_and_a_zero_weight_come_back_closely():
    w = torch.rand(16, 256) + 1.0  # all positive: the min is clamped to 0, the scale covers [0, max]
    assert sqnr_db(w, super_blocks.dequantize(*super_blocks.quantize(w))) > 25
    z = torch.zeros(16, 256)
    assert torch.equal(super_blocks.dequantize(*super_blocks.quantize(z)), z)


@pytest.mark.parametrize("bad, what", [
    (torch.randn(16, 288), "multiple of 256"),
    (torch.full((16, 256), 1e9), "exceeds float16"),
    (torch.randn(16, 256) * 3e-6, "too small for float16"),  # d would underflow: no silent garbage
])
def test_bad_weights_are_refused_with_what_to_do(bad, what):
    with pytest.raises(ValueError, match=what):
        super_blocks.quantize(bad)


def test_to_groups_is_the_same_weight_per_group_of_32():
    w, _ = _weights(32, 512, 3)
    parts = super_blocks.quantize(w)
    q, s, z = super_blocks.to_groups(*parts)
    assert torch.allclose(dequantize(q, s, z, torch.float32), super_blocks.dequantize(*parts), atol=1e-6)


def _q4_k_bytes(codes, sc, mn, d, dmin):
    """Q4_K blocks written by hand from the fields (llama.cpp block_q4_K, the inverse of get_scale_min_k4)."""
    n, k = codes.shape
    blocks = []
    c = codes.reshape(-1, 256)
    sc, mn = sc.reshape(-1, 8), mn.reshape(-1, 8)
    for i in range(c.shape[0]):
        packed = np.zeros(12, dtype=np.uint8)
        packed[0:4] = (sc[i, :4] & 63) | ((sc[i, 4:] >> 4) << 6)
        packed[4:8] = (mn[i, :4] & 63) | ((mn[i, 4:] >> 4) << 6)
        packed[8:12] = (sc[i, 4:] & 0x0F) | ((mn[i, 4:] & 0x0F) << 4)
        qs = c[i].reshape(4, 2, 32)
        blocks.append(np.concatenate([
            np.array([d.reshape(-1)[i]], dtype=np.float16).view(np.uint8),
            np.array([dmin.reshape(-1)[i]], dtype=np.float16).view(np.uint8),
            packed, (qs[:, 0] | (qs[:, 1] << 4)).reshape(-1).astype(np.uint8)]))
    return np.concatenate(blocks)


def test_a_q4_k_tensor_comes_back_bit_for_bit_and_dequantizes_as_the_gguf_package_does():
    from gguf import GGMLQuantizationType
    from gguf import dequantize as gguf_dequantize

    rng = np.random.default_rng(0)
    n, k = 16, 512
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    sc, mn = rng.integers(0, 64, (n, k // 32), dtype=np.uint8), rng.integers(0, 64, (n, k // 32), dtype=np.uint8)
    d = (rng.random((n, k // 256)) * 0.01).astype(np.float16)
    dmin = (rng.random((n, k // 256)) * 0.01).astype(np.float16)
    raw = _q4_k_bytes(codes, sc, mn, d, dmin)
    got = super_blocks.from_q4_k(raw, n, k)
    for a, b in zip(got, (codes, sc, mn, d, dmin), strict=True):
        assert np.array_equal(a, b)
    ref = gguf_dequantize(raw, GGMLQuantizationType.Q4_K).reshape(n, k)
    ours = super_blocks.dequantize(*(torch.from_numpy(np.ascontiguousarray(a)) for a in got)).numpy()
    assert np.allclose(ours, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    with pytest.raises(ValueError, match="needs"):
        super_blocks.from_q4_k(raw[:-1], n, k)


def _q8_k(x):
    """x [M, K] rounded as the kernel's activation quantizer does, returned as float32 [M, K].

    Step for step in float32 as gemm_scalar.cpp: v = x * (127 / amax) with the reciprocal correctly
    rounded (``127 / tensor`` in torch is not: it multiplies by a reciprocal), then |v| + 0.5 truncated.
    Dividing by amax / 127 instead rounds an exact tie the other way (bf16 inputs hit them: x = -amax / 2
    is v = -63.5, which the kernel's product makes -63.499996)."""
    xf = x.float().view(x.shape[0], -1, 256)
    amax = xf.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    v = xf * inv
    codes = (torch.sign(v) * torch.floor(v.abs() + 0.5)).clamp(-127, 127)
    return (codes * (amax / torch.full_like(amax, 127.0))).view_as(x.float())


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=20, deadline=None)
@given(n16=st.integers(1, 6), sbs=st.integers(1, 4), m=st.integers(1, 13), seed=st.integers(0, 2**16),
       bias=st.booleans(), f32=st.booleans())
@example(n16=1, sbs=1, m=1, seed=87, bias=False, f32=False)  # three exact ties (x = -amax / 2)
def test_the_kernel_matches_the_dequantized_reference(isa, n16, sbs, m, seed, bias, f32):
    """The kernel is x @ W.T on the dequantized weight with x rounded to int8 as llama.cpp's Q8_K does
    (one scale max|x| / 127 per row and 256 input channels, round half away from zero): SQNR >= 45 dB
    against that reference (what is left is the output's bf16 rounding and float summation order), and
    >= 30 dB against the unrounded x (the int8 rounding itself; on these non-zero-mean random weights it
    measures 34-40 dB). m covers the 4-row assembly path and its 1-3 row tails; random integer scales and
    mins cover the whole six-bit range."""
    n, k = 16 * n16, 256 * sbs
    gen = torch.Generator().manual_seed(seed)
    parts = (torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
             torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
             torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
             (torch.rand(n, sbs, generator=gen) * 0.01).half(), (torch.rand(n, sbs, generator=gen) * 0.01).half())
    w, sb = native.repack_super_blocks(*parts)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    if f32:
        x, b = x.float(), (b.float() if b is not None else None)
    got = native.linear_super_blocks(x, w, sb, b, isa)
    assert got.shape == (m, n) and got.dtype == x.dtype
    w_ref, b_ref = super_blocks.dequantize(*parts).T, (b.float() if b is not None else 0)
    assert sqnr_db(_q8_k(x) @ w_ref + b_ref, got.float()) >= 45.0
    assert sqnr_db(x.float() @ w_ref + b_ref, got.float()) >= 30.0


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_dequantization_is_the_reference_rounded_to_bf16(isa):
    w0, _ = _weights(48, 768, 4)
    parts = super_blocks.quantize(w0)
    w, sb = native.repack_super_blocks(*parts)
    assert torch.equal(native.dequantize_super_blocks(w, sb, isa), super_blocks.dequantize(*parts).to(torch.bfloat16))


@needs_kernel
@pytest.mark.parametrize("m,k", [(1, 1536), (5, 1536), (64, 1536), (130, 1536), (61, 8960)])
def test_the_vector_path_equals_the_portable_one_and_rows_equal_rows_alone(m, k):
    """The AVX2 kernel and the plain C++ one compute the same integer sums; floats differ only in the
    order of the last additions. Rows of a batch equal each row alone, across the row tiles (64 rows at
    K = 1536; 28 at down_proj's K = 8960, whose activations would not stay in L2 in 64)."""
    w0, gen = _weights(32, k, 5)
    w, sb = native.repack_super_blocks(*super_blocks.quantize(w0))
    x = torch.randn(m, k, generator=gen)
    fast = native.linear_super_blocks(x, w, sb, None, ISAS[0])
    assert torch.allclose(fast, native.linear_super_blocks(x, w, sb, None, "scalar"), rtol=1e-5, atol=1e-5)
    alone = torch.cat([native.linear_super_blocks(x[i:i + 1], w, sb, None, ISAS[0]) for i in range(m)])
    assert torch.equal(fast, alone)


@needs_kernel
@skips.NO_AVX512_VNNI.mark()
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 12, 15, 64, 77, 130])
def test_the_avx512_kernel_equals_the_avx2_one_bit_for_bit(m):
    """vpdpbusd and vpmulld give the AVX2 kernel's integer sums, and the float epilogue is in the same
    order: equal outputs, on every row path (8-row steps, 4-row steps, 1-3 row tails, 64-row tiles)."""
    w0, gen = _weights(48, 768, 8)
    w, sb = native.repack_super_blocks(*super_blocks.quantize(w0))
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(m, 768, generator=gen).to(dtype)
        b = torch.randn(48, generator=gen).to(dtype)
        assert torch.equal(native.linear_super_blocks(x, w, sb, b, "avx512vnni"),
                           native.linear_super_blocks(x, w, sb, b, "avx2"))


@needs_kernel
def test_the_logged_super_block_kernel_is_the_one_this_cpu_runs():
    """The load log names the super-block kernel (config._log_choice): AVX-512 VNNI CPUs run their own,
    every other AVX2 CPU the AVX2 one (kernel revision 7 logged "avx2" on AVX-512 CPUs too)."""
    want = ("avx512vnni" if "avx512vnni" in ISAS else "avx2" if "avx2" in ISAS else "scalar")
    assert native.super_block_isa() == want
    assert want in ISAS


@needs_kernel
def test_the_prefill_path_dequantizes_and_runs_a_bf16_gemm():
    w0, gen = _weights(64, 512, 6)
    parts = super_blocks.quantize(w0)
    w, sb = native.repack_super_blocks(*parts)
    x = torch.randn(20, 512, generator=gen).to(torch.bfloat16)
    got = native.linear_super_blocks(x, w, sb, dequant_min_rows=16)
    want = torch.nn.functional.linear(x, super_blocks.dequantize(*parts).to(torch.bfloat16))
    assert torch.equal(got, want)


@needs_kernel
def test_wrong_layouts_are_named():
    w0, _ = _weights(32, 512, 7)
    w, sb = native.repack_super_blocks(*super_blocks.quantize(w0))
    with pytest.raises(RuntimeError, match="K=768"):
        native.linear_super_blocks(torch.randn(1, 768), w, sb)
    with pytest.raises(RuntimeError, match="sb must be"):
        native.linear_super_blocks(torch.randn(1, 512), w, sb[:, :1].contiguous())
    with pytest.raises(ValueError, match="K % 256"):
        native.repack_super_blocks(torch.zeros(16, 288, dtype=torch.uint8), torch.zeros(16, 9), torch.zeros(16, 9),
                                   torch.zeros(16, 1), torch.zeros(16, 1))


@needs_kernel
@pytest.mark.parametrize("isa", ["auto", "avx2", "scalar"])
def test_degenerate_shapes_are_refused_before_any_arithmetic(isa):
    """K = 0 divided by zero in the AVX2 super-block kernel (SIGFPE killed the process); it and N = 0 are
    refused by name on the GEMM (both row paths) and on dequantization. Reaching the end proves the
    process survived."""
    if isa not in ISAS:
        isa = "scalar"
    op = torch.ops.omni_quant

    def packed(n, k):
        return (torch.zeros(n // 16, k // 8, 16, 4, dtype=torch.uint8),
                torch.zeros(n // 16, k // 256, native.SB_BYTES, dtype=torch.uint8))

    for rows in (None, torch.tensor(1, dtype=torch.int64)):  # the integer kernel, the prefill path
        with pytest.raises(RuntimeError, match="K .input channels. must be positive, got K=0"):
            op.w4a8_linear_sb(torch.randn(3, 0), *packed(32, 0), None, isa, rows)
        with pytest.raises(RuntimeError, match="N .output channels. must be positive"):
            op.w4a8_linear_sb(torch.randn(3, 256), *packed(0, 256), None, isa, rows)
    with pytest.raises(RuntimeError, match="got K=0"):
        op.dequantize_sb(*packed(32, 0), isa)
    with pytest.raises(RuntimeError, match="N .output channels. must be positive"):
        op.dequantize_sb(*packed(0, 256), isa)
    with pytest.raises(ValueError, match="with K > 0"):
        native.linear_super_blocks(torch.randn(3, 0), *packed(32, 0), isa=isa)
    for n, k in ((0, 256), (16, 0)):
        with pytest.raises(ValueError, match="needs N > 0, K > 0"):
            native.repack_super_blocks(torch.zeros(n, k, dtype=torch.uint8), torch.zeros(n, k // 32),
                                       torch.zeros(n, k // 32), torch.zeros(n, k // 256), torch.zeros(n, k // 256))
    w0, gen = _weights(32, 512, 7)
    parts = super_blocks.quantize(w0)
    w, sb = native.repack_super_blocks(*parts)
    x = torch.randn(3, 512, generator=gen)
    want = torch.nn.functional.linear(x, super_blocks.dequantize(*parts).float())
    assert sqnr_db(want, native.linear_super_blocks(x, w, sb, None, isa)) >= 30.0  # still alive


@needs_kernel
@pytest.mark.parametrize("isa, kernel_env, layout", [
    ("avx2", None, "super_blocks"),           # an AVX2 CPU without VNNI: the AVX2 super-block kernel
    ("avx512vnni", None, "super_blocks"),     # AVX-512 VNNI: its own super-block kernel
    ("avx2vnni", None, "groups"),             # AVX-VNNI: rewritten per group of 32 for its measured kernel
    ("avx2", "int4pack", "int4pack"),         # torch's int4 kernel (the fallback) on the same weight
])
def test_a_super_block_layer_loads_into_the_layout_chosen_for_this_cpu(monkeypatch, isa, kernel_env, layout):
    """CpuInt4LinearMethod on a super-block layer (vLLM's parameters, the checkpoint's tensors copied in):
    the layout follows the CPU (monkeypatched best_isa) and OMNI_INT4_KERNEL, and every layout computes the
    same layer (SQNR >= 30 dB against x @ W.T on the dequantized weight)."""
    import vllm.model_executor.parameter as vllm_parameter

    from omni_quant.format.packing import pack
    from omni_quant.runtime.config import CpuInt4Config, CpuInt4LinearMethod

    # one worker, no engine: vLLM's parameters ask the tensor-parallel group for rank and size
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vllm_parameter, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(native, "best_isa", lambda: isa)
    monkeypatch.setenv("OMNI_INT4_DEQUANT_MIN_ROWS", "0")
    if kernel_env:
        monkeypatch.setenv("OMNI_INT4_KERNEL", kernel_env)
    else:
        monkeypatch.delenv("OMNI_INT4_KERNEL", raising=False)
    prefix = "model.layers.0.mlp.down_proj"
    cfg = CpuInt4Config.from_config({"group_size": 32, "format_version": 3, "super_block_modules": [prefix]})
    cfg.packed_modules_mapping = {}
    method = CpuInt4LinearMethod(cfg, prefix)
    layer = torch.nn.Module()
    method.create_weights(layer, 512, [32], 512, 32, torch.bfloat16, weight_loader=lambda p, t: p.data.copy_(t))
    w0, gen = _weights(32, 512, 8)
    parts = super_blocks.quantize(w0)
    for name, t in zip(super_blocks.TENSORS, (pack(parts[0]), *parts[1:]), strict=True):
        getattr(layer, name).data.copy_(t)
    method.process_weights_after_loading(layer)
    assert not any(hasattr(layer, n) for n in super_blocks.TENSORS)  # the on-disk tensors are dropped
    if layout == "super_blocks":
        assert layer.cpu_int4_super_blocks and hasattr(layer, "w4a8_super_blocks")
    elif layout == "groups":
        assert not layer.cpu_int4_super_blocks and hasattr(layer, "w4a8_scales_zeros")
    else:
        assert layer.cpu_int4_kernel == "int4pack"
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    y = method.apply(layer, x)
    assert sqnr_db(x.float() @ super_blocks.dequantize(*parts).T, y.float()) >= 30.0


@needs_kernel
@pytest.mark.parametrize("isa", ISAS)
def test_a_nan_activation_gives_nan_as_the_per_group_path_does(isa):
    w0, gen = _weights(32, 512, 9)
    w, sb = native.repack_super_blocks(*super_blocks.quantize(w0))
    x = torch.randn(3, 512, generator=gen)
    x[1, 5] = float("nan")
    y = native.linear_super_blocks(x, w, sb, None, isa)
    assert bool(torch.isnan(y[1]).all()) and bool(torch.isfinite(y[[0, 2]]).all())


@pytest.mark.parametrize("field, value, what", [
    (0, 16, r"codes must be integers 0..15: 1 position\(s\) out of range, the first codes\[0, 0\] = 16"),
    (1, 64, "sub_scales must be integers 0..63"),
    (2, -1, "sub_mins must be integers 0..63"),
    (3, 1e6, "d must be finite in float16"),
])
def test_repack_refuses_values_out_of_range(field, value, what):
    parts = list(super_blocks.quantize(_weights(16, 256, 10)[0]))
    t = parts[field].to(torch.int64 if field < 3 else torch.float32).clone()
    t.view(-1)[0] = value
    parts[field] = t
    with pytest.raises(ValueError, match=what):
        native.repack_super_blocks(*parts)


def test_from_q4_k_takes_bytes_and_refuses_other_dtypes():
    rng = np.random.default_rng(1)
    fields = (rng.integers(0, 16, (16, 256), dtype=np.uint8), rng.integers(0, 64, (16, 8), dtype=np.uint8),
              rng.integers(0, 64, (16, 8), dtype=np.uint8), np.full((16, 1), 0.01, dtype=np.float16),
              np.full((16, 1), 0.02, dtype=np.float16))
    raw = _q4_k_bytes(*fields)
    for a, b in zip(super_blocks.from_q4_k(raw.tobytes(), 16, 256), fields, strict=True):
        assert np.array_equal(a, b)
    with pytest.raises(TypeError, match="uint8"):
        super_blocks.from_q4_k(raw.astype(np.float32), 16, 256)
