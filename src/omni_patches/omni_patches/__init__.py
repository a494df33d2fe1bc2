"""omni-patches: opt-in fixes for vLLM 0.28 CPU bugs, refused loudly when upstream changes."""

from importlib import metadata as _metadata

__all__ = [
    "PatchRefused",
    "__version__",
    "applied_patches",
    "apply_all",
    "status",
]

from omni_patches import settings as _settings  # noqa: F401  (declares the patch switches first)
from omni_patches._registry import applied_patches
from omni_patches.apply import apply_all, status
from omni_patches.guards import PatchRefused

__version__ = _metadata.version("omni-patches")  # the one version source: pyproject.toml
