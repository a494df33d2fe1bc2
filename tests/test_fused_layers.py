"""omni_quant::norm_qkv_rope and omni_quant::o_mlp (omni_quant.runtime.fused_layers) against the same layer written as
separate torch ops: vLLM 0.28's arithmetic (RMSNorm and fused add + RMSNorm in float32, rounded to bf16 where the
eager code rounds; rotary embedding and SiLU-and-mul in float32 from bf16 inputs, rounded once) around the same
W4A8 linear op. Bit for bit, at decode's one row, a few rows, and a prefill's many (rows in parallel), on every
path this CPU runs (the ops' ``isa`` argument picks the row kernels as it picks the linear's: AVX-512, AVX2, plain C++),
so an AVX-512 machine also checks the AVX2 rows a CI machine without AVX-512 runs."""

from __future__ import annotations

import pytest
import torch

from omni_quant.kernels import w4a8 as native

pytestmark = pytest.mark.skipif(not native.available(), reason="omni's W4A8 kernel was not built")

H, HEADS, KV_HEADS, HEAD, INTER = 512, 4, 2, 128, 768
EPS = 1e-6


def _weights(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    sbs = k // 256
    return native.repack_super_blocks(
        torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
        torch.randint(1, 64, (n, k // 32), generator=gen), torch.randint(0, 64, (n, k // 32), generator=gen),
        (torch.rand(n, sbs, generator=gen) * 0.01).half(), (torch.rand(n, sbs, generator=gen) * 0.01).half())


@pytest.fixture(scope="module")
def layer():
    gen = torch.Generator().manual_seed(0)
    width = (HEADS + 2 * KV_HEADS) * HEAD
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD, 2).float() / HEAD))
    angles = torch.outer(torch.arange(4096).float(), inv)
    return {"qkv": _weights(width, H, gen), "bias": torch.randn(width, generator=gen).bfloat16(),
            "o": _weights(H, HEADS * HEAD, gen), "gate_up": _weights(2 * INTER, H, gen),
            "down": _weights(H, INTER, gen),
            "norm1": torch.randn(H, generator=gen).bfloat16(), "norm2": torch.randn(H, generator=gen).bfloat16(),
            "cache": torch.cat([angles.cos(), angles.sin()], -1).bfloat16()}


ISAS = native.supported_isas() if native.available() else []
"""This CPU's kernel paths, fastest first (``avx512vnni``, ``avx2vnni``, ``avx2``, ``scalar`` where it has them)."""


def _linear(x, w, bias=None, isa="auto"):
    return torch.ops.omni_quant.w4a8_linear_sb(x, w[0], w[1], bias, isa, None)


def _rms(x, weight, residual=None):
    """vllm/ir/ops/layernorm.py (rms_norm, fused_add_rms_norm)."""
    s = x.float() if residual is None else x.float() + residual.float()
    res = x if residual is None else s.bfloat16()
    normed = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)).bfloat16()
    return (normed.float() * weight.float()).bfloat16(), res


def _rope(x, cos_sin, heads, rot, neox):
    """RotaryEmbedding.forward_static / ApplyRotaryEmb.forward_static, in float32 from bf16, rounded once."""
    t = x.view(x.shape[0], heads, HEAD).float()
    cos, sin = (c[:, None] for c in cos_sin.float().chunk(2, -1))
    part, rest = t[..., :rot], t[..., rot:]
    x1, x2 = (part[..., : rot // 2], part[..., rot // 2:]) if neox else (part[..., ::2], part[..., 1::2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat([o1, o2], -1) if neox else torch.stack([o1, o2], -1).flatten(-2)
    return torch.cat([rotated, rest], -1).bfloat16().view(x.shape[0], -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 3, 37])
@pytest.mark.parametrize("neox,rot", [(True, HEAD), (False, HEAD), (True, HEAD // 2)])
@pytest.mark.parametrize("first", [True, False])
def test_norm_qkv_rope_equals_the_separate_ops(layer, isa, rows, neox, rot, first):
    gen = torch.Generator().manual_seed(rows)
    hidden = torch.randn(rows, H, generator=gen).bfloat16()
    residual = None if first else torch.randn(rows, H, generator=gen).bfloat16()
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    cache = layer["cache"][:, :rot] if rot == HEAD else torch.cat(
        [layer["cache"][:, : rot // 2], layer["cache"][:, HEAD // 2: HEAD // 2 + rot // 2]], -1).contiguous()
    qkv, res = torch.ops.omni_quant.norm_qkv_rope(
        hidden, residual, layer["norm1"], EPS, *layer["qkv"], layer["bias"], None, positions, cache,
        HEADS, KV_HEADS, HEAD, rot, neox, isa)
    normed, want_res = _rms(hidden, layer["norm1"], residual)
    q = _linear(normed, layer["qkv"], layer["bias"], isa)
    qs, ks = HEADS * HEAD, KV_HEADS * HEAD
    want = torch.cat([_rope(q[:, :qs], cache[positions], HEADS, rot, neox),
                      _rope(q[:, qs:qs + ks], cache[positions], KV_HEADS, rot, neox), q[:, qs + ks:]], -1)
    assert torch.equal(res, want_res)
    assert torch.equal(qkv, want), (qkv.float() - want.float()).abs().max()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 3, 37])
def test_o_mlp_equals_the_separate_ops(layer, isa, rows):
    gen = torch.Generator().manual_seed(100 + rows)
    attn = torch.randn(rows, HEADS * HEAD, generator=gen).bfloat16()
    residual = torch.randn(rows, H, generator=gen).bfloat16()
    out, res = torch.ops.omni_quant.o_mlp(attn, residual, *layer["o"], None, None, layer["norm2"], EPS,
                                          *layer["gate_up"], None, *layer["down"], None, isa)
    normed, want_res = _rms(_linear(attn, layer["o"], isa=isa), layer["norm2"], residual)
    gate, up = _linear(normed, layer["gate_up"], isa=isa).float().chunk(2, -1)
    want = _linear((gate / (torch.exp(-gate) + 1) * up).bfloat16(), layer["down"], isa=isa)
    assert torch.equal(res, want_res)
    assert torch.equal(out, want), (out.float() - want.float()).abs().max()


def test_a_position_outside_the_rotary_cache_is_refused_by_name(layer):
    hidden = torch.randn(1, H).bfloat16()
    with pytest.raises(RuntimeError, match="position 4096 of token 0 is outside the rotary cache's 4096 positions"):
        torch.ops.omni_quant.norm_qkv_rope(hidden, None, layer["norm1"], EPS, *layer["qkv"], layer["bias"], None,
                                           torch.tensor([4096]), layer["cache"], HEADS, KV_HEADS, HEAD, HEAD, True)


def test_float32_activations_are_refused_not_misread(layer):
    with pytest.raises(RuntimeError, match="hidden_states must be a bfloat16"):
        torch.ops.omni_quant.norm_qkv_rope(torch.randn(1, H), None, layer["norm1"], EPS, *layer["qkv"], layer["bias"],
                                           None, torch.tensor([0]), layer["cache"], HEADS, KV_HEADS, HEAD, HEAD, True)
