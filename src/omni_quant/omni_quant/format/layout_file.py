"""The layout file: cpu_int4 layers already in their kernel's layout, written once and mapped read-only.

One file holds, for every 4-bit layer of one worker's shard, the tensors the layer keeps after
``CpuInt4LinearMethod.process_weights_after_loading`` (``w4a8_weight`` with ``w4a8_scales_zeros``
or ``w4a8_super_blocks``, or torch's ``int4_weight`` with ``int4_scales_zeros``) and the layer's
choice (kernel, scheme, group size, ``dequant_min_rows``). Byte layout (little-endian)::

    0      8 bytes   MAGIC b"OMNILAY1"
    8      8 bytes   uint64 length L of the header (UTF-8 JSON)
    16     L bytes   header: {"key": {...}, "total_bytes": int, "layers": {prefix: {"kernel", "layout",
                     "group_size", "dequant_min_rows", "tensors": {name: {"dtype", "shape", "offset"}}}}}
    ...    tensors   each at an offset that is a multiple of PAGE (4096): page-aligned, so every
                     tensor is a 64-byte-aligned view of a shared file mapping
    end-40 40 bytes  TRAILER_MAGIC b"OMNIEND1" + sha256 of the header bytes

:func:`open_layout` refuses (:class:`LayoutRefused`, with the reason) a file that is not one, is
truncated or longer than its header says, whose header does not match its checksum or is not
the expected JSON, whose tensors fall outside the file, or whose ``key`` differs from the one
expected (the first differing field is named). The tensor bytes themselves are not checksummed:
hashing them would read the whole file at every start, which is what mapping avoids; every byte
the kernels read is bounded by the recorded shapes, so a damaged tensor gives wrong numbers,
never an out-of-bounds read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT", "LayerEntry", "LayoutRefused", "MappedLayout", "drop_cached_pages", "open_layout",
           "remove_stale_temps", "tensor_bytes", "write_layout"]

MAGIC = b"OMNILAY1"
TRAILER_MAGIC = b"OMNIEND1"
TRAILER_BYTES = len(TRAILER_MAGIC) + 32
PAGE = 4096
FORMAT = 1
"""Version of this byte layout: part of every key, bumped when the layout above changes."""
_DTYPES = {"uint8": torch.uint8, "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "int32": torch.int32}
TEMP_MARK = ".tmp-"


class LayoutRefused(ValueError):
    """A layout file that cannot be used; ``str()`` says why (for the one log line)."""


@dataclass
class LayerEntry:
    """One layer of a layout file: ``kernel`` (``native`` or ``int4pack``), ``layout`` (``groups`` or
    ``super_blocks``), ``group_size`` (input channels per group; 32 for super-blocks), ``dequant_min_rows``
    (the row count recorded when the file was written), ``tensors`` (name -> tensor: views of the
    mapping when read, the layer's tensors when written)."""

    kernel: str
    layout: str
    group_size: int
    dequant_min_rows: int
    tensors: dict[str, torch.Tensor]


@dataclass
class MappedLayout:
    """A layout file mapped read-only: ``path``, ``layers`` (prefix -> :class:`LayerEntry` whose tensors
    are views of the mapping), ``nbytes`` (the file's size), ``ino`` (the mapped file's inode number, -1 when
    unknown: a file replaced by rename since has another)."""

    path: Path
    layers: dict[str, LayerEntry]
    nbytes: int
    ino: int = -1


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"omni_quant.format.layout_file: dtype {t.dtype} is not one a layout file stores "
                         f"({list(_DTYPES)})")
    return name


def _header(key: dict[str, Any], layers: dict[str, LayerEntry]) -> tuple[bytes, int]:
    """(header bytes, total file size) with every tensor's offset assigned, page-aligned."""
    meta: dict[str, Any] = {}
    # the header's length depends on the offsets, which depend on the header's length: fix the start of the
    # data with a generous bound first (offsets are at most 20 digits each)
    count = sum(len(e.tensors) for e in layers.values())
    for prefix, e in layers.items():
        meta[prefix] = {"kernel": e.kernel, "layout": e.layout, "group_size": int(e.group_size),
                        "dequant_min_rows": int(e.dequant_min_rows),
                        "tensors": {n: {"dtype": _dtype_name(t), "shape": list(t.shape), "offset": 0}
                                    for n, t in e.tensors.items()}}
    draft = json.dumps({"key": key, "total_bytes": 0, "layers": meta}, sort_keys=True).encode()
    offset = _align(16 + len(draft) + 24 * (count + 1))
    for prefix, e in layers.items():
        for n, t in e.tensors.items():
            meta[prefix]["tensors"][n]["offset"] = offset
            offset = _align(offset + t.numel() * t.element_size())
    total = offset + TRAILER_BYTES
    header = json.dumps({"key": key, "total_bytes": total, "layers": meta}, sort_keys=True).encode()
    assert 16 + len(header) <= min((m["offset"] for lm in meta.values() for m in lm["tensors"].values()),
                                   default=total - TRAILER_BYTES)
    return header, total


def remove_stale_temps(directory: Path) -> None:
    """Delete temporary files of writers that died (SIGKILL, the OOM killer) before renaming them: names
    ``.<file>.tmp-<pid>-*`` whose process no longer runs. Errors are ignored (another cleaner won)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(".") or TEMP_MARK not in name:
            continue
        try:
            pid = int(name.rsplit(TEMP_MARK, 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(directory / name)
            except OSError:
                pass
        except OSError:  # another user's live process
            pass


def _umask() -> int:
    """This process's umask, from ``/proc/self/status`` (setting it to read it would race other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_layout(path: Path, key: dict[str, Any], layers: dict[str, LayerEntry]) -> MappedLayout:
    """Write ``layers`` under ``key`` to ``path`` atomically and return it mapped read-only.

    The bytes go to a temporary file in the same directory (``.<name>.tmp-<pid>-<random>``), are
    flushed to disk (``fsync``), mapped, and only then renamed over ``path``: a reader sees the old
    file or the complete new one, a second writer's rename replaces a complete file with another
    complete one, and the mapping returned is of the bytes this call wrote whichever rename wins.

    Raises:
        OSError: the directory is not writable, the disk is full, or the file system cannot map
            files (the temporary file is removed).
        ValueError: a tensor of a dtype the format does not store.
    """
    path = Path(path)
    header, total = _header(key, layers)
    remove_stale_temps(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TEMP_MARK}{os.getpid()}-")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as any file the user writes (mkstemp makes 0600): other users map it
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(MAGIC + struct.pack("<Q", len(header)) + header)
            meta = json.loads(header)["layers"]
            for prefix, e in layers.items():
                for n, t in e.tensors.items():
                    f.seek(meta[prefix]["tensors"][n]["offset"])
                    f.write(memoryview(t.detach().contiguous().view(-1).view(torch.uint8).numpy()))
            f.seek(total - TRAILER_BYTES)
            f.write(TRAILER_MAGIC + hashlib.sha256(header).digest())
            f.flush()
            os.fsync(fd)
        drop_cached_pages(fd)
        # mapped through a read-only descriptor: a mapping holds the file it was made from, and one opened for
        # writing would count as a writer for as long as the mapping lives (no read lease, runtime.layout_guard)
        rfd = os.open(tmp, os.O_RDONLY)
        try:
            mapped = _cut(_advised_mapping(rfd, total), Path(path), total, json.loads(header), os.fstat(rfd).st_ino)
        finally:
            os.close(rfd)
        os.replace(tmp, path)
        return mapped
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def _parse(head: bytes, size: int) -> dict[str, Any]:
    """The header of a file of ``size`` bytes whose first bytes are ``head``; LayoutRefused on any flaw."""
    if size < 16 + TRAILER_BYTES or head[:8] != MAGIC:
        raise LayoutRefused("not an omni layout file (no OMNILAY1 magic)")
    (length,) = struct.unpack("<Q", head[8:16])
    if 16 + length + TRAILER_BYTES > size:
        raise LayoutRefused(f"truncated: {size} bytes cannot hold its {length}-byte header")
    return {"length": length}


def open_layout(path: Path, key: dict[str, Any]) -> MappedLayout:
    """Map the layout file ``path`` read-only (``PROT_READ``, ``MAP_SHARED``: its pages are the page
    cache's, shared by every process that maps it; on 2 MiB pages where the kernel offers them, and
    faulted in before it returns) after checking it against ``key``. The header and trailer are read
    through the mapping: a ``pread`` before it would fill the file's first and last 2 MiB of page cache
    with 4 KiB folios (see :func:`drop_cached_pages`).

    Raises:
        FileNotFoundError: there is no such file.
        LayoutRefused: the file is not a complete layout file of ``key`` (the message says what differs).
        OSError: the file exists but cannot be read or mapped.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size < 16 + TRAILER_BYTES:
            _parse(b"", size)  # raises: too short to be one
        mm = _advised_mapping(fd, size)
    finally:
        os.close(fd)
    try:
        length = _parse(bytes(mm[:16]), size)["length"]
        header = bytes(mm[16:16 + length])
        trailer = bytes(mm[size - TRAILER_BYTES:])
        try:
            meta = json.loads(header)
            total, found = int(meta["total_bytes"]), meta["key"]
        except (ValueError, KeyError, TypeError) as exc:
            raise LayoutRefused(f"damaged header ({type(exc).__name__}: {exc})") from None
        if total != size:  # the size first: a truncated file's last bytes are not its checksum
            raise LayoutRefused(f"{'truncated' if size < total else 'appended to'}: {size} bytes where its header "
                                f"says {total}")
        if trailer[:8] != TRAILER_MAGIC or trailer[8:] != hashlib.sha256(header).digest():
            raise LayoutRefused("damaged: its header does not match the checksum at its end")
        if found != key:
            diff = sorted(k for k in set(found) | set(key) if found.get(k) != key.get(k))
            raise LayoutRefused("made for another " + ", ".join(
                f"{k} ({found.get(k)!r}; this load needs {key.get(k)!r})" for k in diff))
        return _cut(mm, path, size, meta, st.st_ino)
    except BaseException:
        try:
            mm.close()
        except BufferError:  # tensors were cut from it: they keep it alive until they go
            pass
        raise


def drop_cached_pages(fd: int) -> None:
    """Drop the file's clean, unmapped pages from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``;
    pages another process maps stay).

    Why: ``write()`` fills the page cache with small folios, and a later mapping maps those as they
    are, 4 KiB each. Read back through a ``MADV_HUGEPAGE`` mapping instead, the kernel's fault-time
    readahead allocates PMD-sized (2 MiB) folios on file systems with large folios (Linux
    ``mm/filemap.c``, ``do_sync_mmap_readahead``: ``VM_HUGEPAGE`` gives ``HPAGE_PMD_ORDER`` readahead;
    ext4 since 6.16, xfs since 5.18), and decode, which reads every weight once per token, walks 2 MiB
    pages through the TLB. Measured on Qwen2.5-Coder-1.5B's 851 MiB layout file (Linux 6.18, ext4):
    32 of 851 MiB PMD-mapped after writing, 850 MiB after dropping and mapping again; decode of
    the 4 KiB-mapped file was ranked 17% below the anonymous huge-page copy
    (``harness/results/mapped_weights_qwen-20261204T234838Z.json``). A no-op where ``posix_fadvise`` is
    missing."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
"""``madvise`` advice that faults a range in (read) synchronously; Linux 5.14 (``include/uapi/asm-generic/
mman-common.h``). Python 3.11's ``mmap`` module does not export it."""


def _advised_mapping(fd: int, size: int) -> mmap.mmap:
    """``fd``'s first ``size`` bytes mapped read-only and shared, marked ``MADV_HUGEPAGE`` before its first
    fault (file THP where the kernel and file system offer it; a no-op elsewhere)."""
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return mm


def _cut(mm: mmap.mmap, path: Path, size: int, meta: dict[str, Any], ino: int = -1) -> MappedLayout:
    """Fault ``mm`` in and cut the tensors the header ``meta`` lists out of it.

    Faulted in with ``MADV_POPULATE_READ`` (``MADV_WILLNEED`` on kernels before 5.14), after the
    ``MADV_HUGEPAGE`` advice. With ``MAP_POPULATE`` the first faults come before the advice: 810 of 851
    MiB PMD-mapped against 850 advised first, on Qwen's layout file read from disk."""
    try:
        mm.madvise(MADV_POPULATE_READ)
    except OSError:
        mm.madvise(mmap.MADV_WILLNEED)
    layers: dict[str, LayerEntry] = {}
    try:
        for prefix, lm in meta["layers"].items():
            tensors = {}
            for n, tm in lm["tensors"].items():
                dtype, shape, offset = _DTYPES[tm["dtype"]], [int(s) for s in tm["shape"]], int(tm["offset"])
                count = 1
                for s in shape:
                    count *= s
                nbytes = count * torch.empty(0, dtype=dtype).element_size()
                if offset % PAGE or offset < 16 or offset + nbytes > size - TRAILER_BYTES or min(shape, default=1) < 0:
                    raise LayoutRefused(f"damaged: tensor {prefix}.{n} lies outside the file or off a page")
                with warnings.catch_warnings():  # read-only by design: the kernels never write their weights
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    flat = torch.frombuffer(mm, dtype=dtype, count=count, offset=offset) if count else \
                        torch.empty(0, dtype=dtype)
                tensors[n] = flat.view(shape)
            layers[prefix] = LayerEntry(str(lm["kernel"]), str(lm["layout"]), int(lm["group_size"]),
                                        int(lm["dequant_min_rows"]), tensors)
    except LayoutRefused:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise LayoutRefused(f"damaged header ({type(exc).__name__}: {exc})") from None
    return MappedLayout(Path(path), layers, size, ino)


def tensor_bytes(layers: Iterable[LayerEntry]) -> int:
    """Bytes of the tensors of ``layers`` (without the file's padding)."""
    return sum(t.numel() * t.element_size() for e in layers for t in e.tensors.values())
