"""cpu_int4's super-block scheme (format_version 3): Q4_K's arrangement of 4-bit weights.

Per output channel, super-block of 256 input channels and sub-block ``j`` of 32 in it::

    w = d * sc_j * q  -  dmin * m_j        codes q 0..15; sc_j, m_j integers 0..63; d, dmin float16

4 bits a weight, 6 + 6 bits a sub-block and 2 x 16 bits a super-block: 4.5 bits a weight as llama.cpp
packs it, 4.625 as cpu_int4 stores it (the sub-block scales and mins one byte each, which the kernel
reads without unpacking; :mod:`omni_quant.kernels.w4a8`). The integer sub-block scales let the kernel keep
a super-block's sums in integers and do float work once per 256 input channels (group size 32 in the
per-group scheme does it once per 32). A GGUF file's Q4_K tensors are this scheme bit for bit
(:func:`from_q4_k`); float weights are fitted by :func:`quantize`.

Checkpoint tensors of a super-block module ``M`` (weight ``[N, K]``, K a multiple of 256)::

    M.qweight      uint8    [N, K/2]    codes, nibbles_low_first (as the per-group scheme)
    M.sub_scales   uint8    [N, K/32]   sc_j
    M.sub_mins     uint8    [N, K/32]   m_j
    M.super_scales float16  [N, K/256]  d
    M.super_mins   float16  [N, K/256]  dmin
"""

from __future__ import annotations

import numpy as np
import torch

from omni_quant.format.quant_math import dequantize as dequantize_groups
from omni_quant.format.quant_math import quantize as quantize_groups
from omni_quant.format.quant_math import sqnr_db

__all__ = ["SUB_BLOCK", "SUPER_BLOCK", "TENSORS", "dequantize", "fits", "from_q4_k", "quantize", "to_groups"]

SUPER_BLOCK = 256
SUB_BLOCK = 32
TENSORS = ("qweight", "sub_scales", "sub_mins", "super_scales", "super_mins")
_LEVELS = 63  # six-bit sub-block scales and mins
_F16_MAX = float(torch.finfo(torch.float16).max)


def fits(k: int) -> bool:
    """Whether a weight with ``K`` input channels can be stored in super-blocks (K a multiple of 256)."""
    return k > 0 and k % SUPER_BLOCK == 0


def dequantize(codes: torch.Tensor, sub_scales: torch.Tensor, sub_mins: torch.Tensor, d: torch.Tensor,
               dmin: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``[N, K]``: ``(d * sc_j) * q - (dmin * m_j)``, each product in float32 (as the
    kernel's dequantization). Shapes as in the module docstring (codes unpacked, uint8 ``[N, K]``)."""
    s = d.float().repeat_interleave(8, 1) * sub_scales.float()
    m = dmin.float().repeat_interleave(8, 1) * sub_mins.float()
    return codes.float() * s.repeat_interleave(SUB_BLOCK, 1) - m.repeat_interleave(SUB_BLOCK, 1)


def to_groups(codes: torch.Tensor, sub_scales: torch.Tensor, sub_mins: torch.Tensor, d: torch.Tensor,
              dmin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same weight in the per-group scheme at group size 32, ``(codes, scales, zeros)`` float32
    ``[N, K/32]`` with ``w = (q - 8) * s + z``: ``s = d sc_j``, ``z = 8 s - dmin m_j`` (exact in float32;
    torch's int4 kernel, the fallback, then rounds them to bf16)."""
    s = d.float().repeat_interleave(8, 1) * sub_scales.float()
    z = 8.0 * s - dmin.float().repeat_interleave(8, 1) * sub_mins.float()
    return codes, s, z


def _codes(wg: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Codes of ``wg`` ``[N, S, 8, 32]`` on the grid ``s * q - m`` (``s``, ``m`` ``[N, S, 8]``)."""
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round((wg + m.unsqueeze(-1)) / safe.unsqueeze(-1)).clamp(0, 15)
    return torch.where((s > 0).unsqueeze(-1), q, torch.zeros_like(q))


def _six_bit(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per super-block ``values`` ``[N, S, 8]`` (>= 0) -> (float16 step ``[N, S]``, integers 0..63): the
    step is the largest value / 63, rounded to float16."""
    step = (values.amax(-1) / _LEVELS).to(torch.float16)
    step32 = step.float()
    safe = torch.where(step32 > 0, step32, torch.ones_like(step32))
    ints = torch.round(values / safe.unsqueeze(-1)).clamp(0, _LEVELS)
    return step, torch.where((step32 > 0).unsqueeze(-1), ints, torch.zeros_like(ints))


def quantize(w: torch.Tensor, importance: torch.Tensor | None = None, refine_steps: int = 2):
    """Fit float weights ``w`` ``[N, K]`` (K a multiple of 256) to super-blocks.

    1. Each sub-block of 32 gets its own scale and offset: the per-group fit at group size 32
       (:func:`omni_quant.format.quant_math.quantize`: least squares, weighted by ``importance`` when given,
       with its clipped grids); a sub-block whose grid would start above 0 starts at 0 instead (the
       min is non-negative, as in llama.cpp's Q4_K), its scale then spanning ``[0, max]``.
    2. Per super-block, scales and mins become six-bit integers under one float16 step each
       (``d = max_j s_j / 63``, ``dmin = max_j m_j / 63``), and the codes are rounded on that grid.
    3. ``refine_steps`` times: with codes and integers fixed, ``d`` and ``dmin`` are the weighted least
       squares solution of ``w ~ d * (sc_j q) - dmin * m_j`` (a 2 x 2 system per super-block), the codes
       are rounded again, and the step is kept only where it lowers the super-block's weighted error.

    Args:
        w: float weight ``[N, K]``.
        importance: optional float ``[K]`` >= 0 weighting each input channel's squared error (E[x^2]).

    Returns:
        ``(codes uint8 [N, K], sub_scales uint8 [N, K/32], sub_mins uint8 [N, K/32],
        d float16 [N, K/256], dmin float16 [N, K/256])``.

    Raises:
        ValueError: K is not a multiple of 256, ``w`` holds NaN or inf (from the per-group fit), or a
            super-block's range does not fit float16 steps (magnitudes above about 4e6), or the weights
            are so small that float16 steps cost more than 6 dB of SQNR against float32 constants: keep
            the tensor in bf16 or use the per-group scheme.
    """
    if w.dim() != 2 or not fits(w.shape[1]):
        raise ValueError(f"super-blocks need a 2-D weight whose K is a multiple of {SUPER_BLOCK}, got {tuple(w.shape)}")
    n, k = w.shape
    sbs = k // SUPER_BLOCK
    q0, s0, z0 = quantize_groups(w, SUB_BLOCK, torch.float32, importance=importance)
    low = z0 - 8.0 * s0  # the value of code 0
    # a sub-block of positive weights only: its grid must start at 0 (the min is at least 0), so
    # it spans [0, max] instead of [min, max]
    hi = w.detach().float().view(n, k // SUB_BLOCK, SUB_BLOCK).amax(-1)
    scale = torch.where(low > 0, hi / 15.0, s0).clamp_min(0).view(n, sbs, 8)
    mins = (-low).clamp_min(0).view(n, sbs, 8)
    d, sc = _six_bit(scale)
    dmin, mn = _six_bit(mins)
    if not (bool(torch.isfinite(d.float()).all()) and bool(torch.isfinite(dmin.float()).all())):
        raise ValueError("a super-block's scale or min exceeds float16 (weights above about 4e6); "
                         "keep this tensor in bf16 or convert it per group (--recipe default)")

    wg = w.detach().float().view(n, sbs, 8, SUB_BLOCK)
    if importance is None:
        wt = torch.ones(1, 1, 8, SUB_BLOCK)
    else:
        imp = torch.as_tensor(importance).float().flatten()
        wt = (imp / imp.mean().clamp_min(1e-30)).clamp_min(1e-6).view(1, sbs, 8, SUB_BLOCK)

    def grid(d16, dmin16):
        return d16.float().unsqueeze(-1) * sc, dmin16.float().unsqueeze(-1) * mn

    def error(q, s, m):
        return (wt * (q * s.unsqueeze(-1) - m.unsqueeze(-1) - wg).pow(2)).sum((-1, -2))

    s, m = grid(d, dmin)
    q = _codes(wg, s, m)
    err = error(q, s, m)
    for _ in range(refine_steps):
        a = q * sc.unsqueeze(-1)                    # w ~ d * a - dmin * b
        b = mn.unsqueeze(-1).expand_as(a)
        saa, sbb, sab = (wt * a * a).sum((-1, -2)), (wt * b * b).sum((-1, -2)), (wt * a * b).sum((-1, -2))
        saw, sbw = (wt * a * wg).sum((-1, -2)), (wt * b * wg).sum((-1, -2))
        det = saa * sbb - sab * sab
        ok = det.abs() > 1e-12 * (saa * sbb).clamp_min(1e-30)
        det = torch.where(ok, det, torch.ones_like(det))
        d_new = (saw * sbb - sbw * sab) / det
        dmin_new = -(saa * sbw - sab * saw) / det
        ok &= (d_new >= 0) & (dmin_new >= 0) & (d_new.abs() < _F16_MAX) & (dmin_new.abs() < _F16_MAX)
        d_try = torch.where(ok, d_new, d.float()).to(torch.float16)
        dmin_try = torch.where(ok, dmin_new, dmin.float()).to(torch.float16)
        s_try, m_try = grid(d_try, dmin_try)
        q_try = _codes(wg, s_try, m_try)
        err_try = error(q_try, s_try, m_try)
        better = err_try < err
        d, dmin = torch.where(better, d_try, d), torch.where(better, dmin_try, dmin)
        q = torch.where(better[..., None, None], q_try, q)
        err = torch.where(better, err_try, err)
    out = (q.reshape(n, k).to(torch.uint8), sc.reshape(n, k // SUB_BLOCK).to(torch.uint8),
           mn.reshape(n, k // SUB_BLOCK).to(torch.uint8), d, dmin)
    # float16 steps underflow for tiny weights (a sub-block range below about 1e-3 loses precision, far
    # below collapses): refuse a fit with subnormal steps far worse than the same sub-blocks with float32
    # constants (a positive-only tensor may lose more than 6 dB legitimately: its mins are clamped to 0)
    subnormal = any(bool(((t.float() > 0) & (t.float() < 2 ** -14)).any()) for t in (d, dmin))
    if subnormal and sqnr_db(w, dequantize(*out)) < sqnr_db(w, dequantize_groups(q0, s0, z0, torch.float32)) - 6.0:
        raise ValueError("the weights are too small for float16 super-block steps (sub-block ranges far below "
                         "1e-3); keep this tensor in bf16 or convert it per group (--recipe default)")
    return out


def from_q4_k(raw: np.ndarray, rows: int, cols: int):
    """A GGUF ``Q4_K`` tensor's bytes -> super-blocks, bit for bit (codes, six-bit scales and mins,
    float16 ``d`` and ``dmin`` as stored): the tuple :func:`quantize` returns, as numpy arrays.

    Layout (llama.cpp ``ggml-common.h``, ``block_q4_K``): per 256 values ``d``, ``dmin`` (fp16), 12
    bytes of packed six-bit scales and mins (``get_scale_min_k4``), then 128 bytes where bytes
    ``32 p .. 32 p + 31`` hold sub-block ``2 p`` in their low nibbles and ``2 p + 1`` in their high ones.

    Raises:
        ValueError: K is not a multiple of 256, or the byte count does not match ``[rows, cols]``.
        TypeError: ``raw`` is not bytes or uint8.
    """
    from omni_quant.format.gguf_blocks import scale_min_k4

    if cols % SUPER_BLOCK or rows <= 0 or cols <= 0:
        raise ValueError(f"Q4_K: [{rows}, {cols}] must be positive and K a multiple of its block of {SUPER_BLOCK}")
    nblocks = rows * cols // SUPER_BLOCK
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, dtype=np.uint8)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TypeError(f"Q4_K: expected the tensor's bytes (uint8), got {raw.dtype}")
    raw = np.ascontiguousarray(raw).reshape(-1)
    if raw.size != nblocks * 144:
        raise ValueError(f"Q4_K [{rows}, {cols}] needs {nblocks * 144} bytes, the tensor has {raw.size}")
    b = raw.reshape(nblocks, 144)
    d = b[:, 0:2].copy().view(np.float16)[:, 0]
    dmin = b[:, 2:4].copy().view(np.float16)[:, 0]
    sc, mn = scale_min_k4(b[:, 4:16])
    qs = b[:, 16:144].reshape(nblocks, 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nblocks, SUPER_BLOCK)
    sbs = cols // SUPER_BLOCK
    return (codes.reshape(rows, cols), sc.reshape(rows, sbs * 8), mn.reshape(rows, sbs * 8),
            d.reshape(rows, sbs), dmin.reshape(rows, sbs))
