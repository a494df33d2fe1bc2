"""Decoder layers of the Llama family as two W4A8 torch ops each, around vLLM's attention.

A cpu_int4 decode step of Qwen2.5-Coder-1.5B spends most of its time in the W4A8 GEMVs, and the rest
on the host: between the GEMVs each of its 28 layers runs a fused add + RMSNorm, the QKV bias and rotary
embedding, a second add + RMSNorm and SiLU-and-mul, each a call from inductor's Python wrapper (or from
the eager model) with its allocations and views, plus four calls of the linear op. This module gives
every eligible layer a ``forward`` with two ops instead (``src/omni_quant/csrc/fused_layer_ops.cpp``):

- ``omni_quant::norm_qkv_rope``: (add +) RMSNorm, the QKV projection with its bias, the rotary embedding;
- vLLM's own ``Attention`` module on the split q, k, v (the KV cache write and attention: unchanged);
- ``omni_quant::o_mlp``: o_proj, add + RMSNorm, gate_up, SiLU-and-mul, down_proj.

The arithmetic is vLLM's (fused_layer_ops.cpp names the upstream code it follows) with the same linear op: the two ops
equal it written as separate torch ops bit for bit (``tests/test_fused_layers.py``). Against inductor's graph of
vLLM's layers the order of summation in RMSNorm's mean (and what the compilers contract into multiply-adds) may
differ, so a whole model's greedy tokens can part where two logits nearly tie, as vLLM's own eager and compiled
modes part from each other.

What it was measured to change (docs/peers.md, "One stream with fused decoder layers"): in eager mode every fused
pass had less host work a token than every unfused one; compiled, the two were not separated.

How it reaches vLLM (0.28) without a fork: the published model registry. :func:`register` re-registers
the architectures in :data:`ARCHITECTURES` (``ModelRegistry.register_model``, lazily by name) as
subclasses of vLLM's classes whose ``__init__`` gives the decoder layers a subclass with the fused
``forward`` when the engine runs cpu_int4 (:func:`wanted`). The fused ``forward`` falls back to vLLM's own
per call when a layer is not fit for it (:func:`fits`): a projection on another kernel than the native
super-block one (an AVX-VNNI CPU's per-group layout, torch's int4pack, a bf16 layer), LoRA-wrapped layers,
a norm, rotary embedding or activation other than the plain ones, or activations that are not bf16.
``OMNI_FUSED_LAYERS=0`` keeps vLLM's layers.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["ARCHITECTURES", "fits", "fuse", "is_fused", "register", "wanted"]  # and, lazily, ARCHITECTURES' classes

logger = logging.getLogger("vllm.omni_quant")

ARCHITECTURES = {
    "Qwen2ForCausalLM": ("vllm.model_executor.models.qwen2", "Qwen2DecoderLayer"),
    "LlamaForCausalLM": ("vllm.model_executor.models.llama", "LlamaDecoderLayer"),
}
"""Architecture -> (vLLM module, its decoder layer class): the ones whose layers this module fuses."""

_FUSED: dict[type, type] = {}


def register() -> None:
    """Re-register :data:`ARCHITECTURES` with vLLM's model registry as this module's subclasses (lazily:
    vLLM imports them when it builds such a model)."""
    from vllm import ModelRegistry

    for arch in ARCHITECTURES:
        ModelRegistry.register_model(arch, f"omni_quant.runtime.fused_layers:{arch}")


def wanted(vllm_config: Any) -> bool:
    """Whether an engine of ``vllm_config`` gets fused layers: cpu_int4 weights, ``OMNI_FUSED_LAYERS`` on,
    one tensor- and pipeline-parallel rank, no LoRA, and the vLLM code the two ops stand for unchanged
    (``omni_platform.internals``, ``fused_decoder_layers``: otherwise vLLM's layers, and a warning naming
    what changed)."""
    from omni_platform import envs, internals
    from omni_quant.runtime.config import QUANT_METHOD

    quant = getattr(vllm_config, "quant_config", None)
    parallel = vllm_config.parallel_config
    return bool(envs.OMNI_FUSED_LAYERS and quant is not None and quant.get_name() == QUANT_METHOD
                and parallel.tensor_parallel_size == 1 and parallel.pipeline_parallel_size == 1
                and vllm_config.lora_config is None and internals.holds("fused_decoder_layers"))


def _native(linear: torch.nn.Module) -> bool:
    """A cpu_int4 projection on the native super-block kernel (its ``w4a8_weight``, ``w4a8_super_blocks``)."""
    return (getattr(linear, "cpu_int4_kernel", None) == "native" and getattr(linear, "cpu_int4_super_blocks", False)
            and not getattr(linear, "skip_bias_add", False))


def _plain_structure(layer: torch.nn.Module) -> bool:
    """The layer's parts are the plain ones the two ops compute: vLLM's ``RMSNorm`` with a weight and no
    variance override, ``RotaryEmbedding``'s own ``forward_static`` on a rotary cache, ``SiluAndMul``, a
    decoder ``Attention``, no q/k norm."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    rope = getattr(attn, "rotary_emb", None)
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    return (all(type(n) is RMSNorm and n.has_weight and n.variance_size_override is None for n in norms)
            and isinstance(rope, RotaryEmbedding) and type(rope).forward_static is RotaryEmbedding.forward_static
            and type(rope).forward_native is RotaryEmbedding.forward_native
            and isinstance(getattr(rope, "cos_sin_cache", None), torch.Tensor)
            and type(getattr(mlp, "act_fn", None)) is SiluAndMul
            and type(getattr(attn, "attn", None)) is Attention and not getattr(attn, "qk_norm", False))


def fits(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` (a decoder layer of :data:`ARCHITECTURES`, weights processed) can run the two ops:
    its four projections on the native super-block kernel and its parts the plain ones (decided by
    :func:`fuse` at construction: vLLM's ``RMSNorm`` with a weight, ``RotaryEmbedding``'s own arithmetic,
    ``SiluAndMul``, a decoder ``Attention``, no q/k norm). Attribute reads only: torch.compile evaluates it
    while tracing the layer."""
    if not getattr(layer, "_omni_plain", False):
        return False
    attn, mlp = layer.self_attn, layer.mlp
    return _native(attn.qkv_proj) and _native(attn.o_proj) and _native(mlp.gate_up_proj) and _native(mlp.down_proj)


def is_fused(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a decoder layer that runs the two ops: given the fused ``forward`` by :func:`fuse`
    and fit for it (:func:`fits`)."""
    return type(module) in _FUSED.values() and fits(module)


def _fused_forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                   residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder layer's ``forward`` in two ops (module docstring); vLLM's own where :func:`fits` is False
    or the activations are not bf16 ``[tokens, hidden]`` with ``[tokens]`` positions.

    Args:
        positions: int64 ``[T]``. hidden_states: bf16 ``[T, hidden]``. residual: bf16 ``[T, hidden]``, or
            None at the first layer.

    Returns:
        ``(hidden_states, residual)``, bf16 ``[T, hidden]`` each, as vLLM's layer returns them.
    """
    if not fits(self) or hidden_states.dtype != torch.bfloat16 or hidden_states.dim() != 2 or positions.dim() != 1:
        return self._omni_base_forward(positions, hidden_states, residual)
    attn, mlp = self.self_attn, self.mlp
    qkv_proj, o_proj, gate_up, down = attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
    rope = attn.rotary_emb
    norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
    qkv, residual = torch.ops.omni_quant.norm_qkv_rope(
        hidden_states, residual, norm1.weight, norm1.variance_epsilon, qkv_proj.w4a8_weight,
        qkv_proj.w4a8_super_blocks, qkv_proj.bias, qkv_proj.cpu_int4_dequant_rows, positions,
        rope._match_cos_sin_cache_dtype(hidden_states), attn.num_heads, attn.num_kv_heads, attn.head_dim,
        rope.rotary_dim, rope.is_neox_style)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    out = attn.attn(q, k, v)
    return torch.ops.omni_quant.o_mlp(
        out, residual, o_proj.w4a8_weight, o_proj.w4a8_super_blocks, o_proj.bias, o_proj.cpu_int4_dequant_rows,
        norm2.weight, norm2.variance_epsilon, gate_up.w4a8_weight, gate_up.w4a8_super_blocks,
        gate_up.cpu_int4_dequant_rows, down.w4a8_weight, down.w4a8_super_blocks, down.cpu_int4_dequant_rows)


def fuse(model: torch.nn.Module, layer_cls: type) -> int:
    """Give every ``layer_cls`` module of ``model`` the fused ``forward`` (by a subclass of its class, made
    once per class) and record whether its parts are the plain ones; returns how many are. Their weights
    need not be loaded yet: the projections' kernels are read per call (:func:`fits`)."""
    fused = _FUSED.get(layer_cls)
    if fused is None:
        fused = _FUSED[layer_cls] = type(layer_cls.__name__, (layer_cls,), {
            "forward": _fused_forward, "_omni_base_forward": layer_cls.forward, "__module__": __name__,
            "__doc__": f"vLLM's {layer_cls.__name__} whose forward is two W4A8 ops around its attention "
                       "(omni_quant.runtime.fused_layers)."})
    count = 0
    for module in model.modules():
        if type(module) is layer_cls:
            module.__class__ = fused
            module._omni_plain = _plain_structure(module)
            count += module._omni_plain
    return count


def _subclass(arch: str) -> type:
    import importlib

    module_name, layer_name = ARCHITECTURES[arch]
    module = importlib.import_module(module_name)
    base, layer_cls = getattr(module, arch), getattr(module, layer_name)

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs) -> None:
        base.__init__(self, vllm_config=vllm_config, prefix=prefix, **kwargs)
        if wanted(vllm_config):
            logger.debug("omni: %d %s layers fused (omni_quant.runtime.fused_layers)", fuse(self, layer_cls),
                         layer_name)
            if isinstance(vllm_config.additional_config, dict):
                # The compiled graph differs (two ops a layer): key vLLM's compile cache by it. vLLM computes
                # that hash at the model's first call (vllm/compilation/decorators.py), after this.
                vllm_config.additional_config["omni_fused_layers"] = True

    return type(arch, (base,), {"__init__": __init__, "__module__": __name__,
                                "__doc__": f"vLLM's {arch}, its decoder layers fused when the engine runs "
                                           "cpu_int4 (omni_quant.runtime.fused_layers)."})


def __getattr__(name: str) -> type:
    """The architectures' subclasses, made when vLLM's registry first imports them (module ``__getattr__``:
    importing this module does not import vLLM's model files)."""
    if name in ARCHITECTURES:
        cls = globals()[name] = _subclass(name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
