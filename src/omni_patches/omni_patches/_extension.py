"""omni-patches' entry in the ``omni.extensions`` group: what omni's general plugin runs and asks.

Activation runs in every vLLM process (front end, engine core, worker): the KV and batch-default
patches act in the front end, the others in the worker. It refuses loudly (raises
``PatchRefused``) rather than becoming a silent no-op. The report lists the patches applied in
the process it runs in.
"""

from __future__ import annotations

from typing import Any

from omni_patches.settings import SETTINGS
from omni_platform.extensions import Extension

__all__ = ["extension", "register", "report"]


def register() -> None:
    """Apply omni-patches in this process."""
    from omni_patches.apply import apply_all

    apply_all()


def report(worker: Any = None) -> dict[str, Any]:
    """``applied``: the patches applied in this process, sorted."""
    from omni_patches._registry import applied_patches

    return {"applied": sorted(applied_patches())}


def extension() -> Extension:
    """omni-patches as an omni extension."""
    return Extension(name="patches", distribution="omni-patches", activate=register, report=report,
                     settings=SETTINGS)
