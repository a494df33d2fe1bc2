"""Every mapping of a process and what its resident pages are, from ``/proc/PID/smaps``.

``RssAnon`` in ``/proc/PID/status`` is the sum of the ``Anonymous`` field over all mappings
(proc(5)): pages of anonymous mappings, and the private copies a process wrote into a file mapping
(a shared library's relocated data, ``.bss``). ``RssFile`` is the rest of ``Rss`` less shared memory.
This module reads the mappings and sorts their anonymous pages into kinds the ledger can name:
``file`` (pages written into a mapped file: libraries' data and relocations), ``heap`` (``[heap]``:
the brk heap, glibc's main malloc arena), ``stack`` (``[stack]``), ``thread_stack`` (an anonymous
mapping right after a ``---p`` guard page and sized like a thread stack: how glibc's
``pthread_create`` maps them, ``nptl/allocatestack.c``), ``malloc_arena`` (a glibc thread arena's heap:
64 MiB aligned, read-write then ``---p``, ``malloc/arena.c``), and ``anon`` (every other anonymous mapping:
malloc's large chunks and thread arenas, Python's object arenas, torch tensors, ``mmap`` by libraries).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mapping", "kind_of", "read_smaps"]


@dataclass
class Mapping:
    """One line of ``/proc/PID/maps`` with its ``smaps`` fields, bytes: ``start``/``end`` addresses,
    ``perms`` (e.g. ``rw-p``), ``path`` (``""`` for anonymous, ``[heap]``, a file...), ``rss``,
    ``anonymous`` (counted in RssAnon), ``anon_huge`` (of those, on transparent huge pages)."""

    start: int
    end: int
    perms: str
    path: str
    rss: int = 0
    anonymous: int = 0
    anon_huge: int = 0
    kind: str = "anon"

    @property
    def size(self) -> int:
        return self.end - self.start


_FIELDS = {"Rss:": "rss", "Anonymous:": "anonymous", "AnonHugePages:": "anon_huge"}


def read_smaps(pid: int | str = "self") -> list[Mapping]:
    """The mappings of ``pid`` (``"self"`` for this process), in address order, each with its kind.

    Raises:
        OSError: the process is gone or its smaps unreadable (another user's process).
    """
    text = Path(f"/proc/{pid}/smaps").read_text()
    out: list[Mapping] = []
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            out.append(Mapping(int(lo, 16), int(hi, 16), head[1], head[5] if len(head) > 5 else ""))
        elif head and head[0] in _FIELDS and out:
            setattr(out[-1], _FIELDS[head[0]], int(head[1]) * 1024)  # kB
    for i, m in enumerate(out):
        m.kind = kind_of(m, out[i - 1] if i else None, out[i + 1] if i + 1 < len(out) else None)
    return out


THREAD_STACK_SIZES = (8 << 20, 16 << 20, 2 << 20, 1 << 20)
"""Sizes, bytes, of a guard page plus the anonymous mapping after it that mark a thread stack: glibc's
default (RLIMIT_STACK, 8 MiB here) and common explicit sizes (OpenMP's, Python's threading)."""


MALLOC_HEAP_BYTES = 64 << 20
"""glibc's ``HEAP_MAX_SIZE`` on 64-bit (``malloc/arena.c``: 2 x 32 MiB): a thread arena's heap is mapped
aligned to it, read-write up to what the arena uses and ``---p`` for the rest."""


def kind_of(m: Mapping, before: Mapping | None, after: Mapping | None = None) -> str:
    """The kind of ``m``'s anonymous pages (see the module docstring); ``before`` and ``after`` are the
    mappings just below and above it in the address space, if any."""
    if m.path == "[heap]":
        return "heap"
    if m.path == "[stack]":
        return "stack"
    if m.path.startswith("/") and not m.path.startswith("/dev/zero") and "(deleted)" not in m.path:
        return "file"
    if m.path.startswith("["):
        return "special"  # [vdso], [vvar], [vsyscall]
    if (m.path == "" and before is not None and before.end == m.start and before.perms.startswith("---")
            and before.size <= 64 << 10
            and (m.size in THREAD_STACK_SIZES or before.size + m.size in THREAD_STACK_SIZES)):
        return "thread_stack"
    if (m.path == "" and m.start % MALLOC_HEAP_BYTES == 0 and m.perms.startswith("rw")
            and (m.size == MALLOC_HEAP_BYTES or (after is not None and after.start == m.end
                                                 and after.perms.startswith("---")
                                                 and after.end - m.start == MALLOC_HEAP_BYTES))):
        return "malloc_arena"
    return "anon"
