"""Apply the patches: every check first, then every replacement (all or nothing)."""

from __future__ import annotations

import logging
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
        func = getattr(value, "__func__", value)
        if getattr(func, MARKER, None) == patch.name:  # already ours
            resolved.append((owner, attr, value, True))
            continue
        actual = fingerprint(value)
        if actual != expected:
            match = False
            details.append(f"{target}: source fingerprint {actual[:12]} != {expected[:12]} (written for vLLM 0.28.0)")
        resolved.append((owner, attr, value, False))
    applied = patch.name in applied_patches()
    return resolved, PatchStatus(patch.name, enabled, found, match, applied, "; ".join(details))


def status() -> list[PatchStatus]:
    """Each patch: switched on, targets found, fingerprints matching, applied here."""
    return [_inspect(p)[1] for p in all_patches()]


def apply_all(patches: list[Patch] | None = None, vllm_version: str | None = None) -> list[str]:
    """Apply every enabled patch (default: :func:`all_patches`) on a CPU platform; return the names applied.

    ``vllm_version`` overrides the installed version read from package metadata (tests).

    Raises:
        PatchRefused: vLLM version outside the supported range, a missing target or a
            fingerprint mismatch; raised before any patch is applied.
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
            logger.info("omni-patches: %s switched off by %s=1", patch.name, patch.disable_env)
            continue
        if not st.targets_found or not st.fingerprints_match:
            raise PatchRefused(f"omni-patches: refusing {patch.name}, nothing patched: {st.detail}")
        plans.append((patch, resolved))
    for patch, resolved in plans:
        if all(already for *_, already in resolved):
            mark_applied(patch.name)
            continue
        replacements = patch.make(*[value for _, _, value, _ in resolved])
        for (owner, attr, _, _), new in zip(resolved, replacements, strict=False):
            setattr(owner, attr, new)
        mark_applied(patch.name)
        logger.info("omni-patches: applied %s", patch.name)
    return sorted(applied_patches())
