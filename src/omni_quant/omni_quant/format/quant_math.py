"""Pure tensor math of cpu_int4: group sizes, quantize, dequantize, a reference matmul, SQNR.

No vLLM import. Weight-only, per-group asymmetric 4-bit quantization (the scheme of
GPTQ/AWQ "w4a16 with zero point", in the float-zero form of torch's
``_weight_int4pack_mm_for_cpu``): for each row ``n`` and group of ``group_size``
consecutive input channels with minimum ``lo`` and maximum ``hi``::

    scale = (hi - lo) / 15            (1 if hi == lo)
    q     = clamp(round((w - lo) / scale), 0, 15)          uint8 in 0..15
    zero  = lo + 8 * scale            (the value that code 8 stands for)
    w'    = (q - 8) * scale + zero    == q * scale + lo

Shapes: ``w`` is ``[N, K]`` (out_features x in_features); ``q`` is ``[N, K]`` uint8;
``scales`` and ``zeros`` are ``[N, K // group_size]`` in the storage dtype (bf16).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "GROUP_SIZES",
    "GroupSizeError",
    "choose_group_size",
    "dequantize",
    "dequantize_int8",
    "dequantize_int8_groups",
    "quantize",
    "quantize_int8",
    "quantize_int8_groups",
    "reference_linear",
    "sqnr_db",
    "sqnr_db_rows",
]

ROW_BLOCK = 4096
"""Rows :func:`quantize` fits at a time (rows are independent): bounds its float32 temporaries to
about ten copies of ``ROW_BLOCK x K`` (for a 151936 x 1536 head: ~250 MiB instead of several GiB)."""

GROUP_SIZES = (128, 64, 32)
"""Supported group sizes, largest (fewest bits per weight) first."""


class GroupSizeError(ValueError):
    """No supported group size divides a tensor's K."""


def choose_group_size(k: int, preferred: int, name: str = "tensor") -> int:
    """``preferred`` if it divides ``k``, else the largest smaller supported size that does (C08).

    Raises:
        GroupSizeError: ``preferred`` is not supported, or no supported size <= it divides ``k``
            (the message names the tensor and K).
    """
    if preferred not in GROUP_SIZES:
        raise GroupSizeError(f"group size {preferred} is not one of {GROUP_SIZES}")
    for g in GROUP_SIZES:
        if g <= preferred and k % g == 0:
            return g
    raise GroupSizeError(
        f"{name}: K={k} is not a multiple of any supported group size <= {preferred} "
        f"({', '.join(str(g) for g in GROUP_SIZES if g <= preferred)}); keep it in bf16 with --keep-bf16 {name}"
    )


def quantize(w: torch.Tensor, group_size: int, dtype: torch.dtype = torch.bfloat16, refine_steps: int = 3,
             importance: torch.Tensor | None = None):
    """Quantize ``w`` ``[N, K]`` per group; returns ``(q uint8 [N, K], scales, zeros)``.

    Starts from the min/max grid above, then refines each group ``refine_steps`` times by
    least squares: with the codes fixed, the scale and offset minimizing the squared error
    have a closed form (a 1-D linear regression of ``w`` on ``q``); the codes are then
    rounded again on the new grid. A refinement is kept only where it lowers the group's
    squared error. (The iterative min/scale fit of llama.cpp's ``make_qkx`` family, ggml
    ``ggml-quants.c``, in closed form.)

    ``scales``/``zeros`` are ``[N, K // group_size]`` in ``dtype``; codes are computed against
    the *rounded* scale and zero so that dequantization reproduces what was measured. Rows are
    fitted :data:`ROW_BLOCK` at a time (each row's fit is independent of the others).

    ``importance`` (float ``[K]``, >= 0; e.g. the mean squared activation of each input channel,
    :mod:`omni_quant.conversion.calibration`) weights each input channel's squared error: the regression
    becomes weighted least squares, and the starting grid is also tried clipped to 95, 90, 85 and
    80 % of the group's range, keeping per group the fit with the smallest weighted error. The
    error of ``x @ W.T`` is what this minimizes when the weights are E[x_k^2] (the diagonal of
    llama.cpp's importance matrix, ``imatrix``, and of AWQ's activation-aware scaling).

    A constant group (``hi == lo``) gets the codes 8 and ``zero = lo`` itself, so it dequantizes
    to exactly its value (``lo`` rounded to ``dtype``); its scale, which no code uses, is 1.

    Raises:
        ValueError: ``w`` is not 2-D or holds NaN or inf, ``K`` is not a multiple of ``group_size``,
            ``importance`` is not ``[K]``, finite and non-negative, or a group's range is too wide for
            a finite float32 scale and zero (magnitudes near the float32 maximum, about 3.4e38).
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the weight holds NaN or inf; a 4-bit grid cannot represent it (a corrupt checkpoint, "
                         "or keep this tensor in bf16)")
    if n > ROW_BLOCK:
        parts = [quantize(w[i:i + ROW_BLOCK], group_size, dtype, refine_steps, importance)
                 for i in range(0, n, ROW_BLOCK)]
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))
    wg = w.detach().float().reshape(n, k // group_size, group_size)
    if importance is None:
        weight = torch.ones(1, 1, group_size)
        clips = (1.0,)
    else:
        importance = torch.as_tensor(importance).detach().float().flatten()
        if importance.numel() != k:
            raise ValueError(f"importance must be [K={k}], got {tuple(importance.shape)}")
        if not bool(torch.isfinite(importance).all()) or bool((importance < 0).any()):
            raise ValueError("importance must be finite and >= 0; it holds NaN, inf or negative values")
        weight = (importance / importance.mean().clamp_min(1e-30)).clamp_min(1e-6).reshape(1, k // group_size,
                                                                                           group_size)
        clips = (1.0, 0.95, 0.9, 0.85, 0.8)
    lo_full = wg.amin(dim=-1)
    hi_full = wg.amax(dim=-1)

    def codes_and_error(scale: torch.Tensor, offset: torch.Tensor):
        # offset = value of code 0; stored as zero = offset + 8 * scale (code 8's value)
        s_r = scale.to(dtype).float()
        z_r = (offset + 8.0 * scale).to(dtype).float()
        q = torch.clamp(torch.round((wg - z_r.unsqueeze(-1)) / s_r.unsqueeze(-1) + 8.0), 0, 15)
        err = (weight * ((q - 8.0) * s_r.unsqueeze(-1) + z_r.unsqueeze(-1) - wg).pow(2)).sum(-1)
        return q, err

    best = None
    for clip in clips:
        if clip == 1.0:
            lo, hi = lo_full, hi_full
        else:
            mid, half = (hi_full + lo_full) / 2, (hi_full - lo_full) / 2 * clip
            lo, hi = mid - half, mid + half
        cand = _refine(wg, weight, lo, hi, refine_steps, codes_and_error)
        if best is None:
            best = cand
        else:
            better = cand[3] < best[3]
            best = tuple(torch.where(better.unsqueeze(-1) if c.dim() == 3 else better, c, b)
                         for c, b in zip(cand, best, strict=True))
    q, scale, offset, _ = best
    scale_s = scale.to(dtype)
    zero_s = (offset + 8.0 * scale).to(dtype)
    const = hi_full == lo_full
    if bool(const.any()):  # exact: code 8 stands for the zero, and the zero is the value
        q = torch.where(const.unsqueeze(-1), torch.full_like(q, 8.0), q)
        zero_s = torch.where(const, lo_full.to(dtype), zero_s)
    if not (bool(torch.isfinite(scale_s.float()).all()) and bool(torch.isfinite(zero_s.float()).all())):
        raise ValueError("a group's range overflows its float scale or zero (weights near the float32 maximum, "
                         "about 3.4e38); keep this tensor in bf16")
    return q.to(torch.uint8).reshape(n, k), scale_s, zero_s


def _refine(wg, weight, lo, hi, refine_steps, codes_and_error):
    """The min/max grid from ``lo``..``hi`` refined by (weighted) least squares; ``(q, scale, offset, err)``."""
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    offset = lo
    q, err = codes_and_error(scale, offset)
    wsum = weight.sum(-1)
    for _ in range(refine_steps):
        qm = (weight * q).sum(-1, keepdim=True) / wsum.unsqueeze(-1)
        wm = (weight * wg).sum(-1, keepdim=True) / wsum.unsqueeze(-1)
        var = (weight * (q - qm).pow(2)).sum(-1)
        cov = (weight * (q - qm) * (wg - wm)).sum(-1)
        ok = var > 0
        new_scale = torch.where(ok, cov / torch.where(ok, var, torch.ones_like(var)), scale)
        new_scale = torch.where(new_scale > 0, new_scale, scale)
        new_offset = (wm.squeeze(-1) - new_scale * qm.squeeze(-1))
        q2, err2 = codes_and_error(new_scale, new_offset)
        better = err2 < err
        scale = torch.where(better, new_scale, scale)
        offset = torch.where(better, new_offset, offset)
        q = torch.where(better.unsqueeze(-1), q2, q)
        err = torch.where(better, err2, err)
    return q, scale, offset, err


def dequantize(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype = torch.bfloat16):
    """``(q - 8) * scale + zero`` per group; returns ``[N, K]`` in ``dtype``."""
    n, k = q.shape
    groups = scales.shape[1]
    g = k // groups
    w = (q.float().reshape(n, groups, g) - 8.0) * scales.float().unsqueeze(-1) + zeros.float().unsqueeze(-1)
    return w.reshape(n, k).to(dtype)


def quantize_int8(w: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 8-bit weight-only quantization per output channel: ``(q int8 [N, K], scales [N])``.

    ``scale[n] = max_k |w[n, k]| / 127`` (1 for an all-zero row), rounded to ``dtype`` first, then
    ``q = clamp(round(w / scale), -127, 127)`` against the rounded scale, so ``q * scale`` is exactly
    what the kernel computes: the layout of torch's ``aten._weight_int8pack_mm`` (CPU), int8 ``[N, K]``
    and one scale per row in the activations' dtype.

    Raises:
        ValueError: ``w`` is not 2-D.
    """
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    wf = w.detach().float()
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax)).to(dtype)
    q = torch.clamp(torch.round(wf / scale.float().unsqueeze(1)), -127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` per row: int8 ``[N, K]`` and ``[N]`` -> ``[N, K]`` in ``dtype``."""
    return (q.float() * scales.float().unsqueeze(1)).to(dtype)


INT8_GROUP = 32
"""Group of :func:`quantize_int8_groups`: llama.cpp's ``Q8_0`` block (``QK8_0`` in ``ggml-common.h``)."""


def quantize_int8_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 8-bit quantization per group of 32 along K, llama.cpp's ``Q8_0`` (``quantize_row_q8_0_ref``
    in ``ggml-quants.c``): ``(q int8 [N, K], d float16 [N, K/32])`` with ``w ~= q * d``.

    ``d = max |w| / 127`` of the group rounded to float16 (0 for an all-zero group), then
    ``q = clamp(round(w / d), -127, 127)`` against the rounded ``d`` (llama.cpp divides by the unrounded one;
    the rounded one makes ``q * d`` the best of its codes).

    Raises:
        ValueError: ``w`` is not 2-D with K a multiple of 32, holds NaN or inf, or a group's ``d`` overflows
            float16 (magnitudes above about 8.3e6).
    """
    if w.dim() != 2 or w.shape[1] % INT8_GROUP:
        raise ValueError(f"expected a 2-D weight [N, K] with K a multiple of {INT8_GROUP}, got {tuple(w.shape)}")
    wf = w.detach().float()
    if not bool(torch.isfinite(wf).all()):
        raise ValueError("the weight holds NaN or infinite values")
    n, k = wf.shape
    wg = wf.reshape(n, k // INT8_GROUP, INT8_GROUP)
    d = (wg.abs().amax(-1) / 127.0).to(torch.float16)
    if not bool(torch.isfinite(d).all()):
        raise ValueError("a group's scale overflows float16 (weights above about 8.3e6)")
    d32 = d.float()
    safe = torch.where(d32 > 0, d32, torch.ones_like(d32))
    q = torch.clamp(torch.round(wg / safe.unsqueeze(-1)), -127, 127)
    q = torch.where((d32 > 0).unsqueeze(-1), q, torch.zeros_like(q))
    return q.to(torch.int8).reshape(n, k), d


def dequantize_int8_groups(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``q * d`` per group of 32 in float32: int8 ``[N, K]`` and ``[N, K/32]`` -> float32 ``[N, K]``. Every
    product is exact in float32 (8-bit codes times an 11-bit float16 mantissa), so the result does not
    depend on how a compiler fuses it."""
    n, k = q.shape
    return (q.float().reshape(n, k // INT8_GROUP, INT8_GROUP) * d.float().unsqueeze(-1)).reshape(n, k)


def reference_linear(x: torch.Tensor, q, scales, zeros, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference ``x @ dequantize(q).T (+ bias)`` in float32, cast to ``x.dtype``. ``x`` is ``[..., K]``."""
    w = dequantize(q, scales, zeros, torch.float32)
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


SQNR_CHUNK_ELEMENTS = 1 << 22
""":func:`sqnr_db_rows` sums this many elements at a time (32 MiB of float64)."""


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio, dB: 10 log10(sum ref^2 / sum (ref - approx)^2), summed in float64.

    ``inf`` when the two are equal, ``-inf`` for an all-zero reference that differs, NaN when either
    holds NaN (a kernel's NaN output fails any ``sqnr >= floor`` check). Tensors of the same shape are
    summed a few rows at a time (:func:`sqnr_db_rows`): no float64 copy of the whole tensor."""
    if reference.dim() and reference.shape == approx.shape:
        return sqnr_db_rows(reference, lambda a, b: approx[a:b])
    ref = reference.double()  # float64 sums: squares of float32 values near 1e20 and above overflow float32
    return _db(ref.pow(2).sum().item(), (ref - approx.double()).pow(2).sum().item())


def sqnr_db_rows(reference: torch.Tensor, approx_rows) -> float:
    """:func:`sqnr_db` of ``reference`` ``[N, ...]`` against an approximation made a few rows at a time:
    ``approx_rows(a, b)`` returns rows ``a:b`` of it (e.g. dequantized from codes on demand), so neither
    the approximation nor a float64 copy of either ever exists whole (a 7B model's output head is 545M
    weights: 4.4 GB in float64)."""
    n = reference.shape[0]
    step = max(1, SQNR_CHUNK_ELEMENTS // max(1, reference[0].numel())) if n else 1
    signal = noise = 0.0
    for a in range(0, n, step):
        ref = reference[a:a + step].double()  # float64: squares of values near 1e20 overflow float32
        signal += ref.pow(2).sum().item()
        noise += (ref - approx_rows(a, a + step).double()).pow(2).sum().item()
    return _db(signal, noise)


def _db(signal: float, noise: float) -> float:
    if math.isnan(noise) or math.isnan(signal):
        return float("nan")  # callers compare against a floor: NaN fails every comparison
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * (math.log10(signal) - math.log10(noise))
