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
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["ensure_writable", "write_problem"]

logger = logging.getLogger("vllm.omni_platform")


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
    try:
        private = Path(tempfile.mkdtemp(prefix="omni-vllm-cache-"))
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
