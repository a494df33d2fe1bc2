"""omni-patches: opt-in fixes for vLLM 0.28 CPU bugs, refused loudly when upstream changes."""

__all__ = [
    "PatchRefused",
    "__version__",
    "applied_patches",
    "apply_all",
    "status",
]

from omni_patches._registry import applied_patches
from omni_patches.apply import apply_all, status
from omni_patches.guards import PatchRefused

__version__ = "0.1.0"
