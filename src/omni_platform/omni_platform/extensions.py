"""Activation of the installed omni extensions, in each vLLM process.

omni-quant and omni-patches declare entry points in the group ``omni.extensions``;
installing a distribution is the opt-in. :func:`activate` (called by the ``omni``
general plugin in the front end, the engine core and every worker) starts the orphan
watchdog in processes vLLM spawned (:mod:`omni_platform.lifeline`), checks that the current
vLLM platform is OmniPlatform, then calls each extension's hook once.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
from importlib.metadata import entry_points

from omni_platform import envs

logger = logging.getLogger("vllm.omni_platform.extensions")

__all__ = [
    "EXTENSION_GROUP",
    "OmniNotActiveError",
    "activate",
    "active_extensions",
    "installed_extensions",
]

EXTENSION_GROUP = "omni.extensions"

_active: dict[str, str] = {}
_activated = False


class OmniNotActiveError(RuntimeError):
    """omni extensions were asked to run while the current vLLM platform is not OmniPlatform."""


def installed_extensions() -> dict[str, str]:
    """``{extension name: "distribution version"}`` for every ``omni.extensions`` entry point."""
    found: dict[str, str] = {}
    for ep in entry_points(group=EXTENSION_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "?"
        found[ep.name] = dist
    return found


def active_extensions() -> dict[str, str]:
    """The extensions :func:`activate` ran in this process (empty before it ran)."""
    return dict(_active)


def current_platform_qualname() -> str:
    """Dotted name of the class of ``vllm.platforms.current_platform`` (resolves it if needed)."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    return f"{cls.__module__}.{cls.__qualname__}"


def activate() -> dict[str, str]:
    """Run each installed extension's hook once in this process; return the active ones.

    Raises:
        OmniNotActiveError: the current platform is not OmniPlatform (with the reason the
            omni platform plugin gave, when it declined).
        Exception: whatever an extension's hook raises (never swallowed).
    """
    global _activated
    if _activated:
        return active_extensions()
    if envs.OMNI_ORPHAN_WATCHDOG:  # C13: engine core and workers exit with their parent
        from omni_platform.lifeline import watch_parent

        watch_parent()
    from omni_platform._plugin import PLATFORM_QUALNAME, platform_decline_reason

    platform = current_platform_qualname()
    if platform != PLATFORM_QUALNAME:
        reason = platform_decline_reason() or (
            "the omni platform plugin was not loaded (VLLM_PLUGINS excludes 'omni', or "
            "VLLM_TARGET_DEVICE=cpu bypasses platform plugins)"
        )
        raise OmniNotActiveError(
            f"omni extensions are installed and enabled, but the vLLM platform is {platform}, "
            f"not {PLATFORM_QUALNAME}: {reason}. Run with VLLM_PLUGINS=omni on a CPU build of "
            "vLLM, or uninstall the omni distributions."
        )
    unknown = envs.unknown_omni_variables()
    if unknown:
        logger.warning(
            "omni: ignoring undeclared environment variable(s) %s; declared: %s",
            unknown, ", ".join(sorted(envs.SETTINGS)),
        )
    for ep in entry_points(group=EXTENSION_GROUP):
        hook = ep.load()
        hook()
        _active[ep.name] = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "?"
    _activated = True
    _append_activation_log(platform)
    return active_extensions()


def _append_activation_log(platform: str) -> None:
    path = envs.OMNI_ACTIVATION_LOG
    if not path:
        return
    record = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process_name": multiprocessing.current_process().name,
        "argv0": sys.argv[0] if sys.argv else "",
        "platform": platform,
        "extensions": sorted(_active),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
