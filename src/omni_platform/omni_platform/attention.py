"""One attention op per layer on CPU: vLLM's CPU attention with the KV cache write inside it.

vLLM 0.28's ``Attention.forward`` (``vllm/model_executor/layers/attention/attention.py``)
calls two custom ops per layer when the backend's ``forward_includes_kv_cache_update``
is False, as it is for ``CPUAttentionBackend`` (``vllm/v1/attention/backends/cpu_attn.py``):
``unified_kv_cache_update`` (write this step's K and V into the paged cache) and then
``unified_attention_with_output``. Both are Python functions behind the dispatcher, so
a decode step pays two dispatcher -> Python round trips per layer. This backend is the
same backend with the write moved into ``forward``: one op per layer, the same kernels
(``cpu_attn_reshape_and_cache``, then ``cpu_attention_with_kv_cache``) in the same order.

Selected by ``OmniPlatform.get_attn_backend_cls`` when ``OMNI_CPU_ATTN_ONE_OP=1``.
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

__all__ = ["OmniCpuAttentionBackend", "OmniCpuAttentionImpl"]


class OmniCpuAttentionImpl(CPUAttentionBackendImpl):
    """``CPUAttentionBackendImpl`` whose ``forward`` first writes K and V into the cache.

    Shapes as vLLM's: ``query [T, heads, head_size]``, ``key``/``value``
    ``[T, kv_heads, head_size]``, ``kv_cache [blocks, kv_heads, block_size, 2 * head_size]``.
    The write is skipped exactly where vLLM skips ``unified_kv_cache_update``: a layer that
    shares an earlier layer's cache, no key/value, or no slot mapping for the layer.
    """

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if self.kv_sharing_target_layer_name is None and key is not None and value is not None:
            slot_mapping = get_forward_context().slot_mapping
            layer_slots = slot_mapping.get(layer.layer_name) if isinstance(slot_mapping, dict) else None
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
