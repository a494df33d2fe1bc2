"""Which patches this process has applied."""

from __future__ import annotations

__all__ = ["applied_patches", "mark_applied"]

_applied: set[str] = set()


def applied_patches() -> frozenset[str]:
    """Names of the patches applied in this process."""
    return frozenset(_applied)


def mark_applied(name: str) -> None:
    """Record that patch ``name`` is now applied in this process."""
    _applied.add(name)
