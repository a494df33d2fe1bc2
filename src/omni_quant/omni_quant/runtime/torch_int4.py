"""The cpu_int4 linear: a direct call of torch's ``aten._weight_int4pack_mm_for_cpu``.

No custom op stands between the model and the kernel. A Python custom op registered
with ``direct_register_custom_op`` costs a dispatcher -> Python round trip on every
call, eager and compiled alike (inductor's wrapper calls the Python kernel). The aten
op is a C++ kernel that eager mode calls directly and that inductor lowers to a direct
extern call (``torch/_inductor/quantized_lowerings.py``, PyTorch 2.13); the reshape and
casts around it are ordinary traced tensor ops.

Kernel: ``aten._weight_int4pack_mm_for_cpu`` reads the 4-bit weights directly for any
number of rows. The prefill alternative (dequantize to bf16, then GEMM) was measured
slower at every M from 1 to 512 on an AVX2 machine (by ``harness/kernel_switch.py``, since removed:
see git history); on CPUs with AVX512-BF16 the ranking can reverse at large M (issue 10 measures it).
"""

from __future__ import annotations

import torch

__all__ = ["cpu_int4_linear", "cpu_int8_linear"]


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

    Raises:
        RuntimeError: from aten when K is not a multiple of ``group_size`` or the shapes
            of ``weight`` and ``scales_and_zeros`` disagree.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.dtype != scales_and_zeros.dtype:
        x2 = x2.to(scales_and_zeros.dtype)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), weight, group_size, scales_and_zeros)
    y = y.to(x.dtype).reshape(*shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


def cpu_int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W stored in 8 bits, one scale per output channel: a direct call of
    torch's ``aten._weight_int8pack_mm`` (CPU kernel; inductor lowers it to an extern call too).

    Args:
        x: activations ``[..., K]`` (cast to the scales' dtype, which the kernel requires).
        weight: int8 ``[N, K]``, ``w = q * scale``.
        scales: ``[N]`` (bf16).
        bias: optional ``[N]``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.dtype != scales.dtype:
        x2 = x2.to(scales.dtype)
    y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), weight, scales)
    y = y.to(x.dtype).reshape(*shape[:-1], weight.shape[0])
    return y if bias is None else y + bias
