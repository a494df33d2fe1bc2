"""What this process's allocators hold, by their own accounts (run inside the measured process).

- glibc malloc: ``mallinfo2(3)`` (glibc 2.33+), summed over every arena: ``uordblks`` bytes in use
  from the arenas, ``hblkhd`` bytes in chunks malloc mapped on their own (at or above the mmap
  threshold), ``fordblks`` free bytes the arenas keep (resident where they were touched:
  ``malloc_trim(3)`` returns what it can).
- tcmalloc (vLLM 0.28 preloads it on CPU when its wheel bundles it, ``vllm/platforms/cpu.py``):
  ``MallocExtension_GetNumericProperty`` (gperftools' C API, ``malloc_extension_c.h``), in use and
  the free bytes in its page heap and caches.
- CPython's object allocator (pymalloc, objects of 512 bytes or less): its arenas, mapped one by one
  (1 MiB each on 3.11), from ``sys._debugmallocstats()``; larger objects come from malloc.

:func:`release` asks both mallocs to return free memory and measures what RssAnon gave back.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile
from typing import Any

from omni_platform.procfs import status_bytes

__all__ = ["glibc_malloc", "pymalloc", "release", "tcmalloc"]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def glibc_malloc() -> dict[str, int] | None:
    """glibc's ``mallinfo2()`` in bytes: ``arena`` (bytes the arenas took from the OS), ``in_use``
    (``uordblks + hblkhd``), ``mmapped`` (``hblkhd``), ``free_held`` (``fordblks``), ``top_pad``
    (``keepcost``), ``arenas_counted`` (not given by glibc: None). None where the C library has no
    ``mallinfo2`` (musl, glibc < 2.33)."""
    libc = ctypes.CDLL(None)
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    m = fn()
    return {"arena": m.arena, "in_use": m.uordblks + m.hblkhd, "mmapped": m.hblkhd, "free_held": m.fordblks,
            "top_pad": m.keepcost}


_TC_PROPS = {
    "in_use": "generic.current_allocated_bytes",
    "heap_size": "generic.heap_size",
    "free_held": "tcmalloc.pageheap_free_bytes",
    "released": "tcmalloc.pageheap_unmapped_bytes",
    "central_cache_free": "tcmalloc.central_cache_free_bytes",
    "transfer_cache_free": "tcmalloc.transfer_cache_free_bytes",
    "thread_cache_free": "tcmalloc.current_total_thread_cache_bytes",
}


def tcmalloc() -> dict[str, int] | None:
    """tcmalloc's numeric properties, bytes (``in_use``, ``heap_size``, ``free_held`` in the page heap,
    ``released`` to the OS, and the three caches' free bytes), or None when tcmalloc is not loaded."""
    libc = ctypes.CDLL(None)
    fn = getattr(libc, "MallocExtension_GetNumericProperty", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
    out = {}
    for key, prop in _TC_PROPS.items():
        v = ctypes.c_size_t(0)
        out[key] = v.value if fn(prop.encode(), ctypes.byref(v)) else None
    return out


def _debugmallocstats() -> str:
    """``sys._debugmallocstats()``'s report: it writes to the C-level stderr, so fd 2 is redirected."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as f:
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return f.read()


def _number(text: str, label: str) -> int | None:
    m = re.search(rf"^{re.escape(label)}\s*=\s*([\d,]+)", text, re.M)
    return int(m.group(1).replace(",", "")) if m else None


def pymalloc() -> dict[str, int | None]:
    """CPython's small-object allocator, bytes: ``arenas_mapped`` (arenas x arena size), ``in_blocks``
    (bytes in allocated blocks), ``free_blocks`` (available in its pools). Values are None when this
    Python's report lacks the line (a build without pymalloc)."""
    text = _debugmallocstats()
    m = re.search(r"^(\d+) arenas \* (\d+) bytes/arena", text, re.M)
    return {"arenas_mapped": int(m.group(1)) * int(m.group(2)) if m else None,
            "in_blocks": _number(text, "# bytes in allocated blocks"),
            "free_blocks": _number(text, "# bytes in available blocks")}


def release() -> dict[str, Any]:
    """Ask the mallocs to return free memory, with omni-patches' own call (tcmalloc's
    ``MallocExtension_ReleaseFreeMemory``, glibc's ``malloc_trim(0)``), and measure it: ``{"rss_anon_before",
    "rss_anon_after", "returned"}`` in bytes (``/proc/self/status``), so a ledger can say what the allocator
    caches held."""
    from omni_patches.patches.release_memory import release_free_memory

    before = status_bytes("RssAnon")
    release_free_memory()
    after = status_bytes("RssAnon")
    return {"rss_anon_before": before, "rss_anon_after": after, "returned": before - after}
