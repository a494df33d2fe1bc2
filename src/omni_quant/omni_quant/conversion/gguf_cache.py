"""A GGUF file served as it is: converted once (:mod:`omni_quant.conversion.gguf_file`) into a cache keyed by
the file's sha256 and the converter's version, reused while both are unchanged (``omni-vllm serve
FILE.gguf``): a new omni-quant whose converter writes a better checkpoint (the 4-bit input embedding of
``omni-quant-convert/6``) converts the file again instead of serving the old conversion.

The conversion runs in a child interpreter (``python -m omni_quant.conversion.cli convert``), not in the server's
front end: a front end that ran torch's OpenMP threads could not fork its engine core (GNU OpenMP's
thread pool does not survive a fork; omni-platform forks the server's engine core by default). A file's
digest is remembered by its identity (device, inode, size, modification time) in ``digests.json`` beside
the conversions, so a warm start does not read the whole file again (about 1 s for a 1.1 GB GGUF).

Two starts on one file share one conversion: the first takes an exclusive ``flock`` on
``<conversion>.lock`` while it converts, a second waits for it and then serves the finished copy (C22).
``omni-quant cache list`` shows the conversions with their sizes and last use; ``omni-quant cache prune``
removes those of older converter versions, damaged ones and those unused for ``--days`` (:func:`entries`,
:func:`prune`).

A conversion is not trusted because its ``config.json`` exists (C36): when it is made, every file of it (the
layout cache's ``omni-layouts/`` aside, which has its own checks) is recorded in ``omni-entry.json`` with its size,
sha256 and identity; a later start checks each file's size, and its digest when its identity changed. A damaged
conversion (a shard cut or rewritten after a good start) is converted again, with one line saying why; ``prune``
removes damaged ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RECORD", "CacheEntry", "cached_conversion", "damage", "entries", "file_digest", "prune", "record",
           "resolve_model"]

RECORD = "omni-entry.json"
"""The file in each conversion that records its files' sizes, digests and identities."""
_NOT_RECORDED = ("omni-layouts",)
"""Folders of a conversion written later by the runtime (the layout cache checks its own files)."""

logger = logging.getLogger("vllm.omni_quant.gguf")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def file_digest(path: Path, root: Path) -> str:
    """sha256 (hex) of ``path``, read from ``root/digests.json`` while the file's identity is unchanged.

    The identity is (device, inode, size, modification time in ns): a file rewritten in place or replaced
    gets a new one and is read again. The index is written atomically (a temporary file, then rename);
    an unreadable or unwritable index only costs the read. Raises ``OSError`` if ``path`` cannot be read.
    """
    index_path = root / "digests.json"
    key, ident = str(path.resolve()), _identity(path)
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    entry = index.get(key) if isinstance(index, dict) else None
    if isinstance(entry, dict) and entry.get("identity") == ident and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = _sha256(path)
    if not isinstance(index, dict):
        index = {}
    index[key] = {"identity": ident, "sha256": digest}
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_name(f".digests.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1))
        os.replace(tmp, index_path)
    except OSError as e:
        logger.warning("omni: the digest of %s is not remembered (%s): the next start reads the file again", path, e)
    return digest


def _recorded_files(out: Path) -> list[Path]:
    return sorted(f for f in out.rglob("*") if f.is_file() and f.name != RECORD
                  and f.relative_to(out).parts[0] not in _NOT_RECORDED)


def record(out: Path) -> dict:
    """Write ``out/omni-entry.json``: each file's size (bytes), sha256 and identity; return the record.

    Raises:
        OSError: a file cannot be read, or the record cannot be written.
    """
    files = {str(f.relative_to(out)): {"bytes": f.stat().st_size, "sha256": _sha256(f), "identity": _identity(f)}
             for f in _recorded_files(out)}
    rec = {"files": files}
    tmp = out / f".{RECORD}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(rec, indent=1))
    os.replace(tmp, out / RECORD)
    return rec


def damage(out: Path) -> str | None:
    """Why the conversion ``out`` cannot be served as it is, or None when every recorded file has its size (and,
    where its identity changed since, its sha256). A conversion without a record (an older omni wrote it) is
    None here: :func:`cached_conversion` records it at its next use."""
    try:
        rec = json.loads((out / RECORD).read_text())
        files = rec["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its record {RECORD} is unreadable ({e})"
    for rel, want in files.items():
        f = out / rel
        try:
            size = f.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != want.get("bytes"):
            return f"{rel} holds {size} bytes, {want.get('bytes')} when it was written"
        if _identity(f) != want.get("identity") and _sha256(f) != want.get("sha256"):
            return f"{rel} changed since it was written (sha256 differs)"
    return None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (``prctl(PR_SET_PDEATHSIG)``), so a killed
    server leaves no conversion running; omni-quant's CLI removes its partial output on SIGTERM."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _convert_in_child(gguf: Path, out: Path) -> None:
    """``python -m omni_quant.conversion.cli convert GGUF OUT`` in a child interpreter (the same one as this process).

    Raises:
        omni_quant.conversion.output.ConversionError: the child failed; its error line (or its output's end) is the
            message.
    """
    from omni_quant.conversion.output import ConversionError

    proc = subprocess.run([sys.executable, "-m", "omni_quant.conversion.cli", "convert", str(gguf), str(out)],
                          capture_output=True, text=True, check=False, preexec_fn=_die_with_parent)
    if proc.returncode != 0:
        errors = [ln.removeprefix("omni-quant: error: ") for ln in proc.stderr.splitlines()
                  if ln.startswith("omni-quant: error: ")]
        raise ConversionError(errors[-1] if errors else
                              f"the conversion of {gguf} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")


def cache_root() -> Path:
    """``$VLLM_CACHE_ROOT/omni/gguf``."""
    from vllm import envs as vllm_envs

    return Path(vllm_envs.VLLM_CACHE_ROOT) / "omni" / "gguf"


def cached_conversion(gguf: Path, root: Path | None = None) -> Path:
    """The cpu_int4 checkpoint of ``gguf``: from the cache when this file (by digest) was converted
    before by this converter version, else converted now into it (atomically: an interrupted conversion
    leaves nothing; an older version's directory is left for the user to remove).

    Raises:
        omni_quant.conversion.output.ConversionError: the file cannot be converted.
    """
    from omni_quant.conversion.output import CONVERTER_VERSION

    root = root or cache_root()
    digest = file_digest(gguf, root)
    version = CONVERTER_VERSION.rsplit("/", 1)[-1]
    out = root / f"{gguf.stem}-{digest[:16]}-c{version}"
    with _exclusive(out):
        if (out / "config.json").is_file():
            why = damage(out)
            if why is None and not (out / RECORD).is_file():
                record(out)  # written by an omni that kept no record: trusted once, checked from now on
            if why is None:
                logger.info("omni: %s (sha256 %s...) is served from its cpu_int4 conversion %s", gguf, digest[:16],
                            out)
                os.utime(out)  # last use, for `omni-quant cache prune --days`
                return out
            logger.warning("omni: the conversion %s is damaged (%s); converting %s again", out, why, gguf)
            shutil.rmtree(out)
        logger.info("omni: converting %s (sha256 %s...) to cpu_int4 once, into %s; this first start also writes "
                    "the weights' layout file and the compiled graph, which later starts reuse", gguf, digest[:16],
                    out)
        started = time.monotonic()
        _convert_in_child(gguf, out)
        record(out)
        logger.info("omni: %s converted to cpu_int4 in %.1f s; serving %s", gguf, time.monotonic() - started, out)
    return out


@contextlib.contextmanager
def _exclusive(out: Path):
    """Hold an exclusive ``flock`` on ``<out>.lock`` (created if needed); log once when another process holds it
    (it is converting the same file) and wait for it. The lock is released when the process exits, however."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("omni: another process is converting into %s; waiting for it to finish", out)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass(frozen=True)
class CacheEntry:
    """One conversion in the cache: its directory, size in bytes, last use (mtime, s since the epoch), whether
    the installed converter wrote it (``current``), whether it is complete (has ``config.json``) and why it is
    damaged (:func:`damage`; None when it is not, or when it is incomplete)."""

    path: Path
    bytes: int
    last_used: float
    current: bool
    complete: bool
    damaged: str | None = None


def entries(root: Path | None = None) -> list[CacheEntry]:
    """The conversions under ``root`` (default :func:`cache_root`), most recently used first."""
    from omni_quant.conversion.output import CONVERTER_VERSION

    root = root or cache_root()
    suffix = "-c" + CONVERTER_VERSION.rsplit("/", 1)[-1]
    out = []
    for d in root.iterdir() if root.is_dir() else ():
        if d.is_dir() and not d.name.startswith("."):
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            complete = (d / "config.json").is_file()
            why = damage(d) if complete else None
            out.append(CacheEntry(d, size, d.stat().st_mtime, d.name.endswith(suffix), complete, why))
    return sorted(out, key=lambda e: -e.last_used)


def prune(root: Path | None = None, days: float | None = None, dry_run: bool = False) -> list[CacheEntry]:
    """Remove the conversions of older converter versions, incomplete and damaged ones, and (``days``) those unused
    for more than ``days`` days; a conversion another process holds locked is skipped. Returns what was (or, with
    ``dry_run``, would be) removed."""
    now = time.time()
    removed = []
    for e in entries(root):
        stale = (not e.current or not e.complete or e.damaged is not None
                 or (days is not None and now - e.last_used > days * 86400))
        if not stale:
            continue
        with open(e.path.with_name(e.path.name + ".lock"), "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being converted right now
            if not dry_run:
                shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e)
    return removed


def resolve_model(arg: str) -> str | None:
    """``omni-vllm``'s model resolver: a path to an existing ``.gguf`` file -> its converted checkpoint."""
    path = Path(arg)
    if path.suffix != ".gguf" or not path.is_file():
        return None
    return str(cached_conversion(path))
