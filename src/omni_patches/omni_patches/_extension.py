"""The ``patches`` hook of the ``omni.extensions`` group, run by omni's general plugin.

Runs in every vLLM process (front end, engine core, worker): the KV patch acts in the
front end, the AOT and memory patches in the worker. Refuses loudly (raises
``PatchRefused``) rather than becoming a silent no-op.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Apply omni-patches in this process."""
    from omni_patches.apply import apply_all

    apply_all()
