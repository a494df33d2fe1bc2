"""omni-patches: opt-in fixes for vLLM 0.28 CPU bugs, refused loudly when upstream changes."""

__all__ = ["__version__", "applied_patches"]

from omni_patches._registry import applied_patches

__version__ = "0.1.0"
