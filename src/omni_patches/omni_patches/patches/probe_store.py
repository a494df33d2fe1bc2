"""Results of start-up probes kept across processes: one small file per (kind, key) under vLLM's cache root.

Torch's inductor recomputes two things in every process that loads or compiles a graph, although neither can
change while the files and the machine they describe stay the same: whether each SIMD instruction set builds and
loads (:mod:`omni_patches.patches.isa_probe_cache`) and the hash of Triton's files
(:mod:`omni_patches.patches.triton_key_cache`). The patches key what they store by those inputs; this module only
reads and writes ``$VLLM_CACHE_ROOT/omni_start_probes/<kind>-<key>``.

Nothing here raises: a directory that cannot be read or written (C21's read-only cache root, a full disk) makes
:func:`load` answer None and :func:`save` do nothing, so the caller computes the value as without the patch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["DIRNAME", "MAX_BYTES", "digest", "load", "save", "store_dir"]

logger = logging.getLogger("vllm.omni_patches.probe_store")

DIRNAME = "omni_start_probes"
"""The store's directory under ``VLLM_CACHE_ROOT``."""


def store_dir() -> Path:
    """``$VLLM_CACHE_ROOT/omni_start_probes`` (vLLM's cache root as this process sees it now)."""
    import vllm.envs as envs

    return Path(envs.VLLM_CACHE_ROOT) / DIRNAME


def digest(parts: list) -> str:
    """The sha256 (hex) of ``parts`` as canonical JSON: the key of a stored value."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


MAX_BYTES = 1 << 20
"""The largest value :func:`load` reads (bytes); Triton's key, the largest stored, is a few KiB."""


def load(kind: str, key: str) -> str | None:
    """The text stored for ``kind`` under ``key``, or None (never stored, unreadable, or not a regular file of at
    most :data:`MAX_BYTES`: a FIFO or a device planted at the path neither blocks nor fills memory)."""
    try:
        fd = os.open(store_dir() / f"{kind}-{key}", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        return os.read(fd, MAX_BYTES + 1)[:MAX_BYTES].decode()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def save(kind: str, key: str, value: str) -> None:
    """Store ``value`` for ``kind`` under ``key``: written to a temporary file and renamed, so that a reader sees
    the whole value or nothing. Errors are logged at debug level and otherwise ignored."""
    try:
        directory = store_dir()
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{kind}-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(value)
            os.replace(tmp, directory / f"{kind}-{key}")
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        logger.debug("omni-patches: %s not stored (%s); it is computed again next start", kind, e)
