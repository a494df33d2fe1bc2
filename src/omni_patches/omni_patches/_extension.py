"""The ``patches`` hook of the ``omni.extensions`` group, run by omni's general plugin.

The patches themselves are issue 5; so far the hook applies none.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Apply omni-patches in this process (none yet)."""
