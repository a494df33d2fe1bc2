"""vLLM's cache root when it cannot be written: start anyway, caching in a private directory (C21).

vLLM 0.28 writes under ``VLLM_CACHE_ROOT`` (default ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``) without
handling errors: the model-info cache logs a traceback (``_save_modelinfo_to_cache``,
``vllm/model_executor/models/registry.py``) and compiled mode dies in the first forward pass with
``PermissionError`` from ``os.makedirs`` (``vllm/compilation/decorators.py``, ``backends.py``); even
``VLLM_DISABLE_COMPILE_CACHE=1`` does not stop those directories being made. A read-only home (a container,
a shared account) is enough.

:func:`ensure_writable` runs when omni activates, in the first vLLM process, before vLLM writes anything:
when the root cannot be written it points ``VLLM_CACHE_ROOT`` at a new private directory (``tempfile.mkdtemp``,
removed when that process exits) and sets ``VLLM_DISABLE_COMPILE_CACHE=1`` (nothing there would outlive the
run), with one warning naming the directory, the error and the override. Engine-core and worker processes
inherit the environment and find it writable.

A process killed by ``SIGKILL`` runs no ``atexit``: its private directory (a converted GGUF's weights, hundreds of
MiB) would stay in ``TMPDIR`` for good, and every such start converts again. So each private directory holds an
``owner`` file (the pid and its start time) and :func:`sweep` removes the directories whose owner is gone before a
new one is made.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["PREFIX", "ensure_writable", "sweep", "write_problem"]

logger = logging.getLogger("vllm.omni_platform")

PREFIX = "omni-vllm-cache-"
"""Name prefix of the private directories in the system's temporary directory."""
OWNER = "owner"
"""File in a private directory: ``PID START_TIME`` (psutil's create time, s) of the process that made it."""
UNOWNED_AFTER_S = 3600.0
"""A private directory with no readable owner file (its maker killed between making it and writing the file) is
removed once it is this old (s)."""


def _owner_alive(directory: Path) -> bool:
    import psutil

    try:
        pid_text, started_text = (directory / OWNER).read_text().split()
        return abs(psutil.Process(int(pid_text)).create_time() - float(started_text)) < 1.0
    except (OSError, ValueError):
        try:
            import time

            return time.time() - directory.stat().st_mtime < UNOWNED_AFTER_S
        except OSError:
            return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def sweep(tmp: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's private directories in ``tmp`` (default: the system's temporary directory) whose owner
    process is gone; return them. Never raises."""
    removed = []
    try:
        candidates = list(Path(tmp or tempfile.gettempdir()).glob(PREFIX + "*"))
    except OSError:
        return removed
    for d in candidates:
        try:
            if not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.getuid() or _owner_alive(d):
                continue
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    if removed:
        logger.info("omni: removed %d private cache director%s left by killed runs: %s", len(removed),
                    "y" if len(removed) == 1 else "ies", ", ".join(str(d) for d in removed))
    return removed


def write_problem(directory: str | os.PathLike) -> str | None:
    """Why a file cannot be created in ``directory`` (made first if missing), or None when it can.

    The answer comes from trying (``os.makedirs``, then a temporary file), not from mode bits: root ignores
    modes, and read-only mounts and immutable directories refuse root too."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".omni-write-probe-"):
            pass
    except OSError as e:
        return f"{e.strerror or e} ({e.filename or directory})" if e.strerror else str(e)
    return None


def ensure_writable() -> Path | None:
    """Make vLLM's cache root writable for this run; return the private directory used instead, or None.

    Raises:
        OSError: the root cannot be written and no private directory can be made in the system's temporary
            directory either (``TMPDIR``); the message names both.
    """
    from vllm import envs as vllm_envs

    root = vllm_envs.VLLM_CACHE_ROOT
    why = write_problem(root)
    if why is None:
        return None
    sweep()
    try:
        private = Path(tempfile.mkdtemp(prefix=PREFIX))
        import psutil

        (private / OWNER).write_text(f"{os.getpid()} {psutil.Process().create_time()}")
    except OSError as e:
        raise OSError(f"vLLM's cache root {root} cannot be written ({why}) and no directory can be made in "
                      f"{tempfile.gettempdir()} ({e.strerror or e}): set VLLM_CACHE_ROOT to a writable "
                      "directory") from e
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    os.environ["VLLM_CACHE_ROOT"] = str(private)
    os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    logger.warning(
        "omni: vLLM's cache root %s cannot be written (%s); this run caches in %s, removed at exit, with compile "
        "caching off (VLLM_DISABLE_COMPILE_CACHE=1). Set VLLM_CACHE_ROOT to a writable directory to keep caches "
        "between starts.", root, why, private)
    return private
