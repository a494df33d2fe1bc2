"""The on-disk packing of cpu_int4 codes, with a format version.

The checkpoint stores codes in a layout of ours, independent of any kernel; the
linear method repacks them once at load into the layout of the kernel it uses
(torch's ``_convert_weight_to_int4pack_for_cpu``).
"""

from __future__ import annotations

from enum import Enum

import torch

__all__ = ["FORMAT_VERSION", "READABLE_FORMAT_VERSIONS", "PackFormat", "format_version_for", "pack", "unpack"]

FORMAT_VERSION = 4
"""1: NIBBLES_LOW_FIRST qweight, bf16 scales and zeros [N, K / group_size].
2: as 1, and modules may be 8-bit weight-only (``bits`` / ``bits_per_module``: ``qweight8`` int8
``[N, K]``, ``scales8`` ``[N]``).
3: as 2, and 4-bit modules may be in super-blocks (``super_block_modules``: Q4_K's arrangement,
:mod:`omni_quant.format.super_blocks`).
4: as 3, and the input embedding may be quantized (``embedding_modules``: per group, in super-blocks
or 8-bit per group of 32, :mod:`omni_quant.runtime.embedding`). An older reader would build a bf16 embedding
and fail on its tensors, so such a checkpoint says 4 and older readers refuse it by its version."""

READABLE_FORMAT_VERSIONS = (1, 2, 3, 4)


def format_version_for(bits: set[int], super_blocks: bool = False, embedding: bool = False) -> int:
    """The lowest format version that holds these modules (so older readers keep reading what they
    can): 4 with a quantized input embedding, else 3 with super-block modules, else 1 for ``{4}`` and
    2 with 8-bit modules."""
    if embedding:
        return 4
    if super_blocks:
        return 3
    return 1 if bits <= {4} else 2


class PackFormat(str, Enum):
    """Byte layouts of packed 4-bit codes."""

    NIBBLES_LOW_FIRST = "nibbles_low_first"
    """``qweight`` uint8 ``[N, K / 2]``: byte ``j`` of row ``n`` is
    ``q[n, 2j] | q[n, 2j + 1] << 4`` (code of the even input channel in the low nibble)."""


def pack(q: torch.Tensor) -> torch.Tensor:
    """Codes uint8 ``[N, K]`` in 0..15 -> uint8 ``[N, K / 2]`` (NIBBLES_LOW_FIRST).

    Raises:
        ValueError: K is odd, the dtype is not uint8, or a code exceeds 15.
    """
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"expected uint8 codes [N, K] with even K, got {q.dtype} {tuple(q.shape)}")
    if q.numel() and int(q.max()) > 15:
        raise ValueError("codes must be in 0..15")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K / 2]`` (NIBBLES_LOW_FIRST) -> codes uint8 ``[N, K]``."""
    n, half = packed.shape
    out = torch.empty(n, half * 2, dtype=torch.uint8)
    out[:, 0::2] = packed & 0x0F
    out[:, 1::2] = packed >> 4
    return out
