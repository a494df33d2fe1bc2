"""Start-up, measured the same way for every arm: launch to first token, cold or warm by the arm's cache.

``start_cold_s`` / ``start_warm_s`` (seconds, lower is better) run from the moment the arm's process
was created (``psutil.Process().create_time()``: interpreter start and every import included) to the
first generated token of an 8-token prompt. *Cold* means the arm's cache folder (``VLLM_CACHE_ROOT``,
one per arm in a bench, kept across its passes) held nothing at launch: for vLLM that is the compile
cache, for OpenVINO its compiled-model cache (``CACHE_DIR`` below it); llama.cpp compiles nothing and
keeps no cache, so its cold start is simply its first start in the run, and later starts are warm
(a marker file records that it started). In every case the checkpoint's file pages may already be in
the page cache (the harness does not drop caches): cold here means "no cache of the runtime's own".
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["cache_is_empty", "mark_started", "metric_name", "seconds_since_launch"]


def cache_is_empty(root: str | os.PathLike[str] | None) -> bool:
    """Whether ``root`` is unset, absent or holds no file (at any depth)."""
    if not root or not os.path.isdir(root):
        return True
    return not any(files for _, _, files in os.walk(root))


def metric_name(cold: bool) -> str:
    """``start_cold_s`` or ``start_warm_s``."""
    return "start_cold_s" if cold else "start_warm_s"


def seconds_since_launch() -> float:
    """Seconds since this process was created (wall clock, s)."""
    import psutil

    return time.time() - psutil.Process().create_time()


def mark_started(root: str | os.PathLike[str] | None, runtime: str) -> None:
    """Leave ``<root>/<runtime>-started`` so that the next start of an arm that caches nothing counts as
    warm; no-op without a cache folder."""
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / f"{runtime}-started").write_text(f"{time.time()}\n")
