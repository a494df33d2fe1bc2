"""Resident weights in memory that Linux may back with transparent huge pages (2 MiB).

Decode reads every weight once per token. With 4 KiB pages that is one TLB entry per 4 KiB
of weights (about 230,000 a token for Qwen2.5-Coder-1.5B) and the hardware prefetchers stop
at every 4 KiB boundary; with 2 MiB pages, 512 times fewer. ``python -m harness pages`` (one decode
step's GEMVs, A/B interleaved) and ``harness/specs/huge_pages.json`` (the engine, end to end) measure
the two; docs/cpu_int4.md gives their artifacts and figures.

Most distributions set ``/sys/kernel/mm/transparent_hugepage/enabled`` to ``madvise``: only
memory marked with ``madvise(MADV_HUGEPAGE)`` gets huge pages, and torch marks none unless
``THP_MEM_ALLOC_ENABLE=1`` is set for the whole process (every allocation of 2 MiB or more,
each rounded to its own huge pages: activations included). This module marks only what it
is given: the repacked weights of a layer, copied into anonymous mappings ("arenas") of
:data:`ARENA_BYTES` that are filled in order, so that small tensors share huge pages too and
at most the unused part of the last huge page of an arena is resident without being used.
An arena is unmapped when the last tensor placed in it is freed.

On ``never`` (or a kernel without THP) the copies are plain 4 KiB pages: the same speed as
without this module, and the same memory.
"""

from __future__ import annotations

import logging
import mmap
import threading
from pathlib import Path

import torch

from omni_platform import envs

__all__ = ["ARENA_BYTES", "HUGE_PAGE_BYTES", "MIN_BYTES", "place", "retire_arena", "thp_mode"]

logger = logging.getLogger("vllm.omni_quant")

HUGE_PAGE_BYTES = 2 << 20
"""x86-64's transparent huge page, bytes."""
ARENA_BYTES = 256 << 20
"""Bytes mapped at a time (virtual: only what tensors fill becomes resident)."""
MIN_BYTES = 64 << 10
"""Tensors smaller than this stay where they are (a bias, a layer's few scales)."""
_ALIGN = 64
_THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = _THP_ENABLED) -> str:
    """The kernel's transparent huge page mode: ``always``, ``madvise``, ``never``, or ``absent``.

    Read from ``/sys/kernel/mm/transparent_hugepage/enabled`` (the bracketed word).
    """
    try:
        text = path.read_text()
    except OSError:
        return "absent"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "absent"


class _Arena:
    """Consecutive 64-byte-aligned pieces of anonymous mappings marked ``MADV_HUGEPAGE``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf: torch.Tensor | None = None  # uint8 view of the current mapping, from its first huge page
        self._used = 0
        self.mapped_bytes = 0

    def _map(self, nbytes: int) -> None:
        size = max(ARENA_BYTES, nbytes) + HUGE_PAGE_BYTES
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(mm, dtype=torch.uint8)  # holds the mapping until its last view is freed
        skip = -whole.data_ptr() % HUGE_PAGE_BYTES
        self._buf = whole[skip:]
        self._used = 0
        self.mapped_bytes += size

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 ``[nbytes]`` tensor of fresh (not yet touched) arena memory."""
        with self._lock:
            if self._buf is None or self._used + nbytes > self._buf.numel():
                self._map(nbytes)
            assert self._buf is not None
            out = self._buf[self._used:self._used + nbytes]
            self._used += -(-nbytes // _ALIGN) * _ALIGN
            return out


_arena = _Arena()
_logged = False


def retire_arena() -> None:
    """Stop placing into the current arena: the next :func:`place` maps a fresh one, and the current one is
    unmapped as soon as the tensors placed in it are freed (the arena itself no longer holds it).
    :mod:`omni_quant.runtime.layout_cache` calls it after moving the repacked layers onto their layout file, so that
    the copies' memory goes back to the system instead of staying resident in the last arena."""
    with _arena._lock:
        _arena._buf = None
        _arena._used = 0


def place(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` (same shape and dtype) in THP-marked memory, or ``t`` itself.

    ``t`` itself when ``OMNI_INT4_HUGE_PAGES=0``, when it is smaller than :data:`MIN_BYTES` or not on
    the CPU, or when the kernel has no transparent huge pages (``thp_mode()`` is ``never`` or
    ``absent``). The copy lives as long as any tensor that views it. Not differentiable (weights only).
    """
    global _logged
    if not envs.OMNI_INT4_HUGE_PAGES:
        return t
    nbytes = t.numel() * t.element_size()
    mode = thp_mode()
    if not _logged:
        _logged = True
        if mode in ("always", "madvise"):
            logger.info("omni-quant: cpu_int4 weights in transparent huge pages (THP mode %s)", mode)
        else:
            logger.info("omni-quant: cpu_int4 weights in 4 KiB pages: this kernel's THP mode is %s", mode)
    if nbytes < MIN_BYTES or t.device.type != "cpu" or mode not in ("always", "madvise"):
        return t
    out = _arena.take(nbytes).view(t.dtype).view(t.shape)
    out.copy_(t)
    return out
