"""One attention op per layer on CPU: vLLM's CPU attention with the KV cache write inside it.

vLLM 0.28's ``Attention.forward`` (``vllm/model_executor/layers/attention/attention.py``)
calls two custom ops per layer when the backend's ``forward_includes_kv_cache_update``
is False, as it is for ``CPUAttentionBackend`` (``vllm/v1/attention/backends/cpu_attn.py``):
``unified_kv_cache_update`` (write this step's K and V into the paged cache) and then
``unified_attention_with_output``. Both are Python functions behind the dispatcher, so
a decode step pays two dispatcher -> Python round trips per layer. This backend is the
same backend with the write moved into ``forward``: one op per layer, the same kernels
(``cpu_attn_reshape_and_cache``, then ``cpu_attention_with_kv_cache``) in the same order.

Selected by ``OmniPlatform.get_attn_backend_cls`` wherever vLLM picks its CPU attention, unless
``OMNI_CPU_ATTN_ONE_OP=0``. A decode step then runs one Python attention op per layer, not two, on a
short path (``OmniCpuAttentionImpl``); the host work per decode token this saves is measured by
``tg_host_ms`` (``harness/arms/vllm.py``; docs/peers.md).
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

__all__ = ["OmniCpuAttentionBackend", "OmniCpuAttentionImpl"]

_RESHAPE_AND_CACHE = torch.ops._C.cpu_attn_reshape_and_cache.default
_ATTENTION = torch.ops._C.cpu_attention_with_kv_cache.default


_SELF_ATTENTION = ("decoder",)  # AttentionType.DECODER: the types whose KV this op writes and reads from the cache


class OmniCpuAttentionImpl(CPUAttentionBackendImpl):
    """``CPUAttentionBackendImpl`` whose ``forward`` first writes K and V into the cache.

    Shapes as vLLM's: ``query [T, heads, head_size]``, ``key``/``value``
    ``[T, kv_heads, head_size]``, ``kv_cache [blocks, kv_heads, block_size, 2 * head_size]``.
    The write is skipped exactly where vLLM skips ``unified_kv_cache_update``: a layer that
    shares an earlier layer's cache, no key/value, or no slot mapping for the layer.

    Decoder self-attention takes a short path with the same two kernels and arguments as
    vLLM's ``forward`` and ``do_kv_cache_update``: the layer's key and value views of its cache
    are made once (the cache tensor lives as long as the engine's KV cache), the ops are called
    as ``OpOverload`` objects (no ``vllm._custom_ops`` wrapper, no overload resolution), and
    query and output are sliced only when the batch is padded. Every other case (warm-up
    without metadata, encoder attention, fused output quantization) is vLLM's code.
    """

    _kv: torch.Tensor | None = None
    _kv_views: tuple[torch.Tensor, torch.Tensor] | None = None

    def _views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_cache, value_cache) of ``kv_cache`` as vLLM's CPU backend makes them: each
        ``[blocks, kv_heads, block_size, head_size]``, views into the cache."""
        if self._kv is not kv_cache:
            blocks, kv_heads, block_size, _ = kv_cache.size()
            key_cache, value_cache = kv_cache.view((blocks, kv_heads, block_size * 2, -1)).chunk(2, dim=2)
            self._kv, self._kv_views = kv_cache, (key_cache, value_cache)
        return self._kv_views  # type: ignore[return-value]

    def _write_slots(self, layer, key: torch.Tensor | None, value: torch.Tensor | None) -> torch.Tensor | None:
        """The layer's slot mapping (int64 ``[T]``) when this step writes its K and V, else None: where vLLM's
        ``Attention.forward`` would call ``unified_kv_cache_update`` (own cache, key and value given, a slot
        mapping for the layer)."""
        if self.kv_sharing_target_layer_name is not None or key is None or value is None:
            return None
        slot_mapping = get_forward_context().slot_mapping
        return slot_mapping.get(layer.layer_name) if isinstance(slot_mapping, dict) else None

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if (attn_metadata is None or output_scale is not None or output_block_scale is not None
                or self.attn_type not in _SELF_ATTENTION):
            return self._vllm_forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                      output_scale, output_block_scale)
        key_cache, value_cache = self._views(kv_cache)
        layer_slots = self._write_slots(layer, key, value)
        if layer_slots is not None:
            _RESHAPE_AND_CACHE(key, value, key_cache, value_cache, layer_slots, self.isa,
                               layer._k_scale_float, layer._v_scale_float, self.kv_cache_dtype)
        md = attn_metadata
        n = md.num_actual_tokens
        _ATTENTION(query if query.size(0) == n else query[:n], key_cache, value_cache,
                   output if output.size(0) == n else output[:n], md.query_start_loc, md.seq_lens, self.scale,
                   md.causal, self.alibi_slopes, self.sliding_window, md.block_table, self.logits_soft_cap,
                   md.scheduler_metadata, self.sinks, md.dynamic_causal, layer._k_scale_float,
                   layer._v_scale_float, self.kv_cache_dtype)
        return output

    def _vllm_forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                      output_block_scale) -> torch.Tensor:
        """vLLM's ``do_kv_cache_update`` then vLLM's ``forward``, unchanged."""
        layer_slots = self._write_slots(layer, key, value)
        if layer_slots is not None:
            self.do_kv_cache_update(layer, key, value, kv_cache, layer_slots)
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                               output_scale, output_block_scale)


class OmniCpuAttentionBackend(CPUAttentionBackend):
    """``CPUAttentionBackend`` with ``forward_includes_kv_cache_update = True`` (see the module docstring)."""

    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_impl_cls() -> type[OmniCpuAttentionImpl]:
        return OmniCpuAttentionImpl
