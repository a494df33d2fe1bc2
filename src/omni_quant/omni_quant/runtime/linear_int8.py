"""The 8-bit weight-only linear of a cpu_int4 checkpoint (the recipes that keep a tensor at 8 bits).

Checkpoint tensors per module: ``qweight8`` int8 ``[N, K]`` and ``scales8`` ``[N]`` (bf16), one
symmetric scale per output channel (:func:`omni_quant.format.quant_math.quantize_int8`). That is already
the layout of torch's CPU kernel ``aten._weight_int8pack_mm``, so loading repacks nothing.
"""

from __future__ import annotations

import logging

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, register_weight_loader_v2_supported_method
from vllm.model_executor.parameter import ChannelQuantScaleParameter, ModelWeightParameter

from omni_quant.runtime import huge_pages
from omni_quant.runtime.torch_int4 import cpu_int8_linear

__all__ = ["CpuInt8LinearMethod"]

logger = logging.getLogger("vllm.omni_quant")
_logged: set[tuple[int, int]] = set()


@register_weight_loader_v2_supported_method
class CpuInt8LinearMethod(LinearMethodBase):
    """8-bit weight-only linear for CPU: ``aten._weight_int8pack_mm`` called directly (as
    :mod:`omni_quant.runtime.torch_int4` calls the int4 one)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        """Create ``qweight8`` int8 ``[N, K]`` and ``scales8`` ``[N]`` (``params_dtype``) for this shard."""
        weight_loader = extra_weight_attrs["weight_loader"]
        n = sum(output_partition_sizes)
        layer.register_parameter("qweight8", ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.int8),
            input_dim=1, output_dim=0, weight_loader=weight_loader))
        layer.register_parameter("scales8", ChannelQuantScaleParameter(
            data=torch.empty(n, dtype=params_dtype), output_dim=0, weight_loader=weight_loader))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Freeze the loaded tensors (the kernel reads them as they are); one log line per shape."""
        n, k = layer.qweight8.shape
        if (n, k) not in _logged:
            _logged.add((n, k))
            logger.info("omni-quant: cpu_int4 [%d x %d] 8-bit weight-only: torch _weight_int8pack_mm", n, k)
        layer.qweight8 = torch.nn.Parameter(huge_pages.place(layer.qweight8.data.contiguous()), requires_grad=False)
        layer.scales8 = torch.nn.Parameter(layer.scales8.data.contiguous(), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return cpu_int8_linear(x, layer.qweight8, layer.scales8, bias)

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        raise ValueError(
            f"cpu_int4: {self.prefix} is quantized (8-bit) but the config ties it to the input embedding; "
            "re-convert with `omni-quant convert`, which writes a quantized head untied")
