"""GPTQ-format 4-bit tensors (round to nearest), for stock vLLM's own CPU int4 path.

``omni-quant convert --format gptq`` writes what vLLM 0.28's ``AutoGPTQConfig``
(``vllm/model_executor/layers/quantization/auto_gptq.py``) loads: symmetric 4-bit
(``sym: true``, the only 4-bit type it maps, ``uint4b8``: ``w = (q - 8) * s``), no act-order
(``desc_act: false``), one group size for every layer; on CPU vLLM then multiplies with
``CPUWNA16LinearKernel`` (``_C.cpu_gemm_wna16``, or its W4A8 kernel on AMX CPUs). This is the
baseline's format, not an omni format: no GPTQ error correction (round to nearest), integer
zero point 8 everywhere.

Tensors per linear module, as AutoGPTQ packs them (v1 checkpoint format):
``qweight`` int32 ``[K/8, N]`` (8 codes of consecutive input channels per int32, first in the
low nibble); ``qzeros`` int32 ``[K/g, N/8]`` holding ``zero - 1 = 7`` per output channel (the
v1 convention; vLLM ignores it when ``sym`` is true); ``scales`` ``[K/g, N]`` (fp16);
``g_idx`` int32 ``[K]`` = ``k // g``.
"""

from __future__ import annotations

import torch

__all__ = ["pack_gptq", "quantize_sym", "dequantize_sym"]


def quantize_sym(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest per group: ``s = 2 max|w| / 15``, ``q = clamp(round(w / s) + 8, 0, 15)``.

    Args:
        w: ``[N, K]`` float weight, K a multiple of ``group_size``.

    Returns:
        ``(q, s)``: uint8 codes ``[N, K]`` and float16 scales ``[N, K / group_size]``.
    """
    n, k = w.shape
    wg = w.float().reshape(n, k // group_size, group_size)
    s = (wg.abs().amax(dim=-1) * 2 / 15).clamp_min(1e-8).to(torch.float16)
    q = torch.round(wg / s.float().unsqueeze(-1)) + 8
    return q.clamp(0, 15).to(torch.uint8).reshape(n, k), s


def dequantize_sym(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``(q - 8) * s`` per group, float32 ``[N, K]``."""
    n, k = q.shape
    g = k // s.shape[1]
    return ((q.float().reshape(n, -1, g) - 8) * s.float().unsqueeze(-1)).reshape(n, k)


def _pack8(codes: torch.Tensor, dim: int) -> torch.Tensor:
    """Pack 8 consecutive 4-bit values along ``dim`` into one int32 (first value in the low nibble)."""
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // 8, 8)
    out = torch.zeros(c.shape[:-1], dtype=torch.int64)
    for j in range(8):
        out |= c[..., j] << (4 * j)
    out = torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)  # two's complement int32
    return out.movedim(-1, dim)


def pack_gptq(q: torch.Tensor, s: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """One linear's GPTQ tensors from :func:`quantize_sym`'s output.

    Returns:
        ``{"qweight", "qzeros", "scales", "g_idx"}`` (see the module docstring for layouts).

    Raises:
        ValueError: K not a multiple of 8 and of ``group_size``, or N not a multiple of 8.
    """
    n, k = q.shape
    if k % 8 or k % group_size or n % 8:
        raise ValueError(f"GPTQ packing needs K % 8 == 0, K % group_size == 0 and N % 8 == 0; got [N={n}, K={k}], "
                         f"group_size={group_size}")
    groups = k // group_size
    return {
        "qweight": _pack8(q.t().contiguous(), 0),                                       # [K/8, N]
        "qzeros": _pack8(torch.full((groups, n), 7, dtype=torch.uint8), 1),             # [K/g, N/8]
        "scales": s.t().contiguous(),                                                   # [K/g, N]
        "g_idx": (torch.arange(k, dtype=torch.int32) // group_size),                    # [K]
    }
