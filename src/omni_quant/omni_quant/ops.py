"""The custom op ``torch.ops.omni_quant.cpu_int4_linear``, in omni's own op namespace.

Registered with vLLM's ``direct_register_custom_op`` (``vllm/utils/torch_utils.py``,
vLLM 0.28) with a fake (meta) implementation, so that torch.compile traces it in vLLM's
default compiled mode as an opaque op. Registering twice in one process is a no-op.

Kernel: torch's ``aten._weight_int4pack_mm_for_cpu`` (PyTorch 2.13, CPU), which reads
the 4-bit weights directly for any number of rows. The prefill alternative
(dequantize to bf16, then GEMM) was measured slower at every M from 1 to 512 on this
machine (``harness/kernel_switch.py``), so there is no switch: one path, one resident
layout.
"""

from __future__ import annotations

import torch

__all__ = ["OP_NAMESPACE", "cpu_int4_linear", "register_ops"]

OP_NAMESPACE = "omni_quant"
_lib: torch.library.Library | None = None


def _cpu_int4_linear_impl(
    x: torch.Tensor, weight: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.dtype != scales_and_zeros.dtype:
        x2 = x2.to(scales_and_zeros.dtype)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), weight, group_size, scales_and_zeros)
    return y.to(x.dtype).reshape(*shape[:-1], weight.shape[0])


def _cpu_int4_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def register_ops() -> None:
    """Define ``omni_quant::cpu_int4_linear`` (CPU kernel + fake); harmless when repeated."""
    global _lib
    if _lib is not None or hasattr(torch.ops, OP_NAMESPACE) and hasattr(torch.ops.omni_quant, "cpu_int4_linear"):
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    direct_register_custom_op(
        "cpu_int4_linear",
        _cpu_int4_linear_impl,
        fake_impl=_cpu_int4_linear_fake,
        target_lib=lib,
        dispatch_key="CPU",
    )
    _lib = lib


def cpu_int4_linear(x: torch.Tensor, weight: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W stored in 4 bits.

    Args:
        x: activations ``[..., K]`` (bf16; other dtypes are cast to the scales' dtype).
        weight: uint8 ``[N, K / 2]`` in torch's CPU int4 layout
            (``aten._convert_weight_to_int4pack_for_cpu``).
        scales_and_zeros: ``[K / group_size, N, 2]``: scale and float zero of each group,
            ``w = (q - 8) * scale + zero``.
        group_size: input channels per group (32, 64 or 128).
        bias: optional ``[N]``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    register_ops()
    y = torch.ops.omni_quant.cpu_int4_linear(x, weight, scales_and_zeros, group_size)
    return y if bias is None else y + bias
