"""glibc malloc's mmap threshold, fixed, so that freed temporaries go back to the OS.

glibc serves an allocation at or above ``M_MMAP_THRESHOLD`` (128 KiB at start) with its own
``mmap`` and unmaps it at ``free``; below it, from an arena, where freed memory stays with the
process. The threshold is dynamic (``mallopt(3)``, "M_MMAP_THRESHOLD"): each time a mapped chunk
is freed the threshold rises to its size, up to 32 MiB on 64-bit. vLLM's start-up frees many
temporaries of a few MiB (weight loading, the warm-up forward, the sampler's warm-up over the
vocabulary), so afterwards every temporary up to 32 MiB comes from the arenas, and what they free
stays resident: ``python -m harness ledger`` names it "free bytes the mallocs keep" (glibc's
``fordblks``). Setting the threshold explicitly turns the dynamic adjustment off (and fixes the trim
threshold at twice it, glibc ``malloc/malloc.c``).

:func:`apply` runs in every process omni's general plugin reaches: ``mallopt`` for this process
(from now on), and ``MALLOC_MMAP_THRESHOLD_`` in the environment (glibc's tunable, read at start) for
the processes it spawns, so that an engine core is covered from its first allocation. A value the
user already set in ``MALLOC_MMAP_THRESHOLD_`` (or ``GLIBC_TUNABLES``) is left alone. Not glibc (musl,
tcmalloc preloaded): nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import os

from omni_platform import envs

__all__ = ["M_MMAP_THRESHOLD", "apply"]

logger = logging.getLogger("vllm.omni_platform.malloc")

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number of the mmap threshold (glibc ``malloc.h``)."""
_ENV = "MALLOC_MMAP_THRESHOLD_"


def apply() -> int | None:
    """Fix glibc's mmap threshold at ``OMNI_MALLOC_MMAP_THRESHOLD`` bytes in this process and its future
    children; return the threshold set, or None when nothing was done (setting 0, a user's own
    ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES``, tcmalloc loaded, or no glibc ``mallopt``)."""
    value = envs.OMNI_MALLOC_MMAP_THRESHOLD
    if not value:
        return None
    if (os.environ.get(_ENV) not in (None, str(value))) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return None  # the user's own malloc tuning wins
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or hasattr(libc, "MallocExtension_GetNumericProperty"):
        return None
    if mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(value)) != 1:
        logger.warning("omni: mallopt(M_MMAP_THRESHOLD, %d) was refused; glibc's dynamic threshold stays", value)
        return None
    os.environ[_ENV] = str(value)
    return value
