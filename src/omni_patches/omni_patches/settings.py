"""omni-patches' settings: one switch per patch, declared in omni's settings registry.

Imported by ``omni_patches/__init__.py``, so the switches are declared before any of them is
read, in every process that imports omni-patches (omni-platform names none of them).
"""

from __future__ import annotations

from omni_patches.patches import all_patches
from omni_platform import envs

__all__ = ["SETTINGS"]

SETTINGS = tuple(
    envs.bool_setting(p.disable_env, False, f"1 switches off omni-patches' {p.name} ({p.doc})")
    for p in all_patches()
)
envs.register(SETTINGS)
