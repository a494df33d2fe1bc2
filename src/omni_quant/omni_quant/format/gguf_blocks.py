"""llama.cpp's 4-bit GGUF blocks in cpu_int4's form, without requantizing: the 4-bit codes are kept.

cpu_int4 stores ``w = (q - 8) * s + z`` per group of 32 (codes ``q`` 0..15, a scale ``s`` and a
float zero ``z``). Three GGUF block types are that form already, up to the group's constants:

- ``Q4_0`` (32 values, fp16 ``d``): ``w = (q - 8) * d``  ->  ``s = d``, ``z = 0``;
- ``Q4_1`` (32 values, fp16 ``d`` and ``m``): ``w = q * d + m``  ->  ``s = d``, ``z = m + 8 d``;
- ``Q4_K`` (super-blocks of 256 = 8 groups of 32, fp16 ``d`` and ``dmin``, 6-bit ``sc_j`` and
  ``m_j`` per group): ``w = q * (d sc_j) - dmin m_j``  ->  ``s = d sc_j``, ``z = 8 d sc_j - dmin m_j``.

The codes are copied bit for bit and ``s``, ``z`` computed in float32 are exact for all three;
cpu_int4 then stores them in bf16, which rounds each to 8 significant bits (relative error at most
2^-9 per group constant). Layouts (llama.cpp ``ggml-common.h``; the ``gguf`` package's
``quants.py`` dequantizes the same bytes, which the tests compare against): Q4_0 is ``d`` then 16
bytes whose low nibbles are values 0..15 and high nibbles 16..31 (Q4_1: ``d``, ``m``, then the
same); Q4_K is ``d``, ``dmin``, 12 bytes of packed 6-bit scales and mins, then 128 bytes where
bytes ``32 j .. 32 j + 31`` carry group ``2 j`` in their low nibbles and group ``2 j + 1`` in
their high nibbles.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EXACT_TYPES", "GROUP", "q8_0_parts", "scale_min_k4", "stored_values_finite", "to_cpu_int4"]

GROUP = 32
EXACT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144}
_BLOCK_VALUES = {"Q4_0": 32, "Q4_1": 32, "Q4_K": 256}


# Block types by their fp16 fields, the only place a quantized block can hold NaN or inf (its codes
# are integers): (bytes a block, byte offsets of the fp16 fields). llama.cpp ggml-common.h.
_F16_FIELDS = {"Q4_0": (18, (0,)), "Q4_1": (20, (0, 2)), "Q5_0": (22, (0,)), "Q5_1": (24, (0, 2)),
               "Q8_0": (34, (0,)), "Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)),
               "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def stored_values_finite(raw: np.ndarray, kind: str) -> bool | None:
    """Whether a GGUF tensor's bytes can only dequantize to finite values: its F32 / F16 / BF16 data, or
    the fp16 scales of each block of a quantized type, all finite. Reads the stored bytes only (no
    dequantization). None for a type not listed here (the caller checks the dequantized values).

    Args:
        raw: the tensor's bytes as stored (any shape and dtype; viewed as bytes)."""
    b = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if kind in ("F32", "F16"):
        return bool(np.isfinite(b.view(np.float32 if kind == "F32" else np.float16)).all())
    if kind == "BF16":
        return not bool(((b.view(np.uint16) & 0x7F80) == 0x7F80).any())  # exponent all ones: inf or NaN
    if kind not in _F16_FIELDS:
        return None
    size, offsets = _F16_FIELDS[kind]
    blocks = b[: b.size - b.size % size].reshape(-1, size)
    return all(bool(np.isfinite(blocks[:, at:at + 2].copy().view(np.float16)).all()) for at in offsets)


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    return raw[:, at:at + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """16 bytes a block -> 32 codes: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes a super-block -> 8 six-bit scales and 8 six-bit mins (``get_scale_min_k4``)."""
    s = scales.astype(np.uint8)
    sc = np.empty((s.shape[0], 8), dtype=np.uint8)
    mn = np.empty((s.shape[0], 8), dtype=np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def to_cpu_int4(raw: np.ndarray, kind: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A GGUF tensor's bytes -> ``(codes uint8 [rows, cols], scales f32 [rows, cols/32], zeros f32)``.

    Args:
        raw: the tensor's bytes as stored (uint8, any shape; ``rows * cols / block`` blocks, row-major).
        kind: ``"Q4_0"``, ``"Q4_1"`` or ``"Q4_K"``.
        rows, cols: the weight's shape ``[N, K]`` (out x in); K is a multiple of the block size.

    Raises:
        ValueError: another type, or a byte count that does not match the shape.
    """
    if kind not in EXACT_TYPES:
        raise ValueError(f"{kind} is not one of the 4-bit types cpu_int4 takes as they are "
                         f"({', '.join(EXACT_TYPES)})")
    per = _BLOCK_VALUES[kind]
    if cols % per:
        raise ValueError(f"{kind}: K={cols} is not a multiple of its block of {per}")
    nblocks = rows * cols // per
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != nblocks * _BLOCK_BYTES[kind]:
        raise ValueError(f"{kind} [{rows}, {cols}] needs {nblocks * _BLOCK_BYTES[kind]} bytes, "
                         f"the tensor has {raw.size}")
    b = raw.reshape(nblocks, _BLOCK_BYTES[kind])
    if kind == "Q4_0":
        d = _f16(b, 0)
        codes = _nibbles_32(b[:, 2:18])
        scales, zeros = d[:, None], np.zeros((nblocks, 1), dtype=np.float32)
    elif kind == "Q4_1":
        d, m = _f16(b, 0), _f16(b, 2)
        codes = _nibbles_32(b[:, 4:20])
        scales, zeros = d[:, None], (m + 8.0 * d)[:, None]
    else:  # Q4_K
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, mn = scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144].reshape(nblocks, 4, 32)
        codes = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(nblocks, 256)  # groups 2j, 2j+1 of pair j
        scales = d[:, None] * sc.astype(np.float32)
        zeros = 8.0 * scales - dmin[:, None] * mn.astype(np.float32)
    groups_per_row = cols // GROUP
    return (codes.reshape(rows, cols).astype(np.uint8),
            scales.reshape(rows, groups_per_row).astype(np.float32),
            zeros.reshape(rows, groups_per_row).astype(np.float32))


def q8_0_parts(raw: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A GGUF ``Q8_0`` tensor's bytes -> ``(q int8 [rows, cols], d float16 [rows, cols/32])``, bit for bit:
    ``w = q * d`` (llama.cpp ``block_q8_0``: fp16 ``d`` then 32 int8 values, 34 bytes a block).

    Raises:
        ValueError: K is not a multiple of 32, or the byte count does not match ``[rows, cols]``."""
    if cols % GROUP or rows <= 0 or cols <= 0:
        raise ValueError(f"Q8_0: [{rows}, {cols}] must be positive and K a multiple of its block of {GROUP}")
    nblocks = rows * cols // GROUP
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != nblocks * 34:
        raise ValueError(f"Q8_0 [{rows}, {cols}] needs {nblocks * 34} bytes, the tensor has {raw.size}")
    b = raw.reshape(nblocks, 34)
    d = b[:, 0:2].copy().view(np.float16)[:, 0]
    q = b[:, 2:34].copy().view(np.int8)
    return q.reshape(rows, cols), d.reshape(rows, cols // GROUP)
