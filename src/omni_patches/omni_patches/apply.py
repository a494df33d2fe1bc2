"""Apply the patches: every check first, then every replacement (all or nothing)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from omni_patches._registry import applied_patches, mark_applied
from omni_patches.guards import PatchRefused, check_vllm_version, fingerprint, resolve
from omni_patches.patches import MARKER, Patch, all_patches

__all__ = ["PatchStatus", "apply_all", "status"]

logger = logging.getLogger("vllm.omni_patches")


@dataclass
class PatchStatus:
    """One patch as seen in this process."""

    name: str
    enabled: bool
    targets_found: bool
    fingerprints_match: bool
    applied: bool
    detail: str


def _inspect(patch: Patch) -> tuple[list, PatchStatus]:
    from omni_platform import envs  # the one registry: accepts 1/0/true/false/yes/no/on/off, rejects others

    enabled = not getattr(envs, patch.disable_env)
    resolved, found, match, details = [], True, True, []
    for target, expected in patch.targets.items():
        try:
            owner, attr, value = resolve(target)
        except PatchRefused as e:
            found, match = False, False
            details.append(str(e))
            continue
        if _carries(value, patch.name):  # already ours (possibly wrapped by a later patch of the same target)
            resolved.append((owner, attr, value, True))
            continue
        try:
            actual = fingerprint(value)
        except (OSError, TypeError) as e:  # no source to read: a builtin, a C function, code made at run time
            match = False
            details.append(f"{target}: source fingerprint unavailable ({e}; written for vLLM 0.28.0)")
            resolved.append((owner, attr, value, False))
            continue
        if actual != expected:
            match = False
            details.append(f"{target}: source fingerprint {actual[:12]} != {expected[:12]} (written for vLLM 0.28.0)")
        resolved.append((owner, attr, value, False))
    applied = patch.name in applied_patches()
    return resolved, PatchStatus(patch.name, enabled, found, match, applied, "; ".join(details))


def _carries(value, name: str) -> bool:
    """Whether ``value`` or a function it wraps (the ``__wrapped__`` chain) is the replacement of patch ``name``."""
    func = getattr(value, "__func__", value)
    while func is not None:
        if getattr(func, MARKER, None) == name:
            return True
        func = getattr(func, "__wrapped__", None)
    return False


def status() -> list[PatchStatus]:
    """Each patch: switched on, targets found, fingerprints matching, applied here."""
    return [_inspect(p)[1] for p in all_patches()]


_ABSENT = object()
"""Stands for "the owner had no attribute of its own" (an inherited method) when restoring."""


def _set(owner, attr: str, new, undo: list) -> None:
    """``setattr(owner, attr, new)``; once it succeeded, record in ``undo`` how to put the original back."""
    original = vars(owner).get(attr, _ABSENT)
    setattr(owner, attr, new)
    undo.append((owner, attr, original))


def _restore(undo: list) -> list[str]:
    """Put back every attribute recorded by :func:`_set`, newest first; the ones that could not be."""
    failed = []
    for owner, attr, original in reversed(undo):
        try:
            if original is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)
        except Exception as e:  # keep restoring the others, then say which failed
            failed.append(f"{getattr(owner, '__name__', owner)}.{attr} ({e!r})")
    undo.clear()
    return failed


def _replace(patch: Patch, resolved: list, undo: list) -> None:
    """Run ``patch.make`` on the targets as they are now and set each replacement (recorded in ``undo``).

    "As they are now": a target an earlier patch of this call replaced is passed with that replacement,
    so two patches of one target compose (the later wraps the earlier) instead of the later dropping it.
    """
    replacements = list(patch.make(*[getattr(owner, attr) for owner, attr, _, _ in resolved]))
    if len(replacements) != len(resolved):
        raise PatchRefused(f"omni-patches: refusing {patch.name}: make() returned {len(replacements)} "
                           f"replacement(s) for {len(resolved)} target(s) ({', '.join(patch.targets)})")
    for (owner, attr, _, _), new in zip(resolved, replacements, strict=True):
        _set(owner, attr, new, undo)


def apply_all(patches: list[Patch] | None = None, vllm_version: str | None = None) -> list[str]:
    """Apply every enabled patch (default: :func:`all_patches`) on a CPU platform; return the names applied.

    All or nothing: every check runs before the first replacement, and when a patch's ``make``
    raises, returns a different number of replacements than the patch has targets, or setting a
    replacement fails, every attribute this call set (of every patch) is put back and no patch is
    recorded as applied. ``vllm_version`` overrides the installed version read from package
    metadata (tests).

    Raises:
        PatchRefused: vLLM version outside the supported range, a missing target, a fingerprint
            mismatch, or targets of one patch partly replaced already (raised before any patch is
            applied); or a patch whose replacements could not be made or set (raised after every
            target was restored; the original error is its ``__cause__``).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        logger.info("omni-patches: not a CPU platform, no patch applied")
        return []
    check_vllm_version(vllm_version)
    plans = []
    for patch in all_patches() if patches is None else patches:
        resolved, st = _inspect(patch)
        if not st.enabled:
            logger.info("omni-patches: %s switched off by %s=%s", patch.name, patch.disable_env,
                        os.environ.get(patch.disable_env, "1"))
            continue
        if not st.targets_found or not st.fingerprints_match:
            raise PatchRefused(f"omni-patches: refusing {patch.name}, nothing patched: {st.detail}")
        done = [already for *_, already in resolved]
        if any(done) and not all(done):
            raise PatchRefused(f"omni-patches: refusing {patch.name}, nothing patched: only some of its targets "
                               f"carry its replacement ({', '.join(patch.targets)})")
        plans.append((patch, resolved, all(done)))
    undo: list = []
    for patch, resolved, already in plans:
        if already:
            continue
        try:
            _replace(patch, resolved, undo)
        except Exception as e:
            failed = _restore(undo)
            outcome = ("every target this call had set is restored, nothing patched" if not failed else
                       f"restoring FAILED for {'; '.join(failed)}: vLLM is left partly patched")
            why = str(e) if isinstance(e, PatchRefused) else \
                f"omni-patches: refusing {patch.name}: making or setting its replacements failed: {e!r}"
            raise PatchRefused(f"{why}; {outcome}") from e
    for patch, _, already in plans:
        mark_applied(patch.name)
        if not already:
            logger.info("omni-patches: applied %s", patch.name)
    return sorted(applied_patches())
