"""Activation of the installed omni extensions, in each vLLM process, and what they report.

omni-quant and omni-patches declare entry points in the group ``omni.extensions``;
installing a distribution is the opt-in. Each entry point is a function returning an
:class:`Extension`: its name, its distribution, its settings, what to do in a process and a
``report()`` about itself. :func:`activate` (called by the ``omni`` general plugin in the front
end, the engine core and every worker) starts the orphan watchdog in processes vLLM spawned
(:mod:`omni_platform.lifeline`), checks that the current vLLM platform is OmniPlatform, then
activates each extension once. The platform asks the active extensions about themselves
(:func:`reports`) and imports none of them (pluggy's host and plugins, ``_manager.py``).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from omni_platform import envs

logger = logging.getLogger("vllm.omni_platform.extensions")

__all__ = [
    "EXTENSION_GROUP",
    "Extension",
    "OmniNotActiveError",
    "activate",
    "active_extensions",
    "declare_installed_settings",
    "installed_distributions",
    "installed_extensions",
    "reports",
    "resolve_model",
]

EXTENSION_GROUP = "omni.extensions"

_active: dict[str, str] = {}
_extensions: dict[str, Extension] = {}
_activated = False


class OmniNotActiveError(RuntimeError):
    """omni extensions were asked to run while the current vLLM platform is not OmniPlatform."""


@dataclass(frozen=True)
class Extension:
    """What an ``omni.extensions`` entry point returns.

    ``name``: the entry point's name (``quant``, ``patches``); ``distribution``: the pip
    distribution that ships it; ``settings``: its environment variables (declared in
    :mod:`omni_platform.envs` when its package is imported); ``activate``: run once in every vLLM
    process; ``report(worker)``: a JSON-able dict about the extension in this process (``worker``:
    the vLLM worker when called inside one through ``collective_rpc``, else None).
    """

    name: str
    distribution: str
    activate: Callable[[], None]
    report: Callable[[Any], dict[str, Any]]
    settings: tuple[envs.Setting, ...] = field(default=())
    resolve_model: Callable[[str], str | None] | None = None
    """``omni-vllm``: a model argument this extension serves in another form (omni-quant: a
    ``.gguf`` file -> its cpu_int4 conversion), or None when it is not one of its own."""


def _load(ep) -> Extension:
    ext = ep.load()()
    if not isinstance(ext, Extension):
        raise TypeError(f"entry point {ep.name} = {ep.value} of group {EXTENSION_GROUP} returned "
                        f"{type(ext).__name__}, not omni_platform.extensions.Extension")
    envs.register(ext.settings)
    return ext


def reports(worker: Any = None) -> dict[str, dict[str, Any]]:
    """``{extension name: its report}`` for every extension active in this process.

    An extension whose report raises is reported as ``{"error": "<type>: <message>"}``: a
    report is for reading, it must not take the caller down."""
    out: dict[str, dict[str, Any]] = {}
    for name, ext in sorted(_extensions.items()):
        try:
            out[name] = ext.report(worker)
        except Exception as exc:  # noqa: BLE001  (named in the report instead)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def installed_extensions() -> dict[str, str]:
    """``{extension name: "distribution version"}`` for every ``omni.extensions`` entry point."""
    found: dict[str, str] = {}
    for ep in entry_points(group=EXTENSION_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "?"
        found[ep.name] = dist
    return found


def installed_distributions() -> dict[str, str | None]:
    """``{distribution: version}`` of omni-platform and of every distribution that ships an
    ``omni.extensions`` entry point (what ``omni-info`` lists; the platform names none of them)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("omni-platform")
    except PackageNotFoundError:
        own = None
    dists = {"omni-platform": own}
    for ep in entry_points(group=EXTENSION_GROUP):
        if ep.dist is not None:
            dists[ep.dist.name] = ep.dist.version
    return dists


def resolve_model(arg: str) -> str:
    """``arg`` as the first installed extension that knows it resolves it (else unchanged)."""
    for ep in entry_points(group=EXTENSION_GROUP):
        ext = _load(ep)
        if ext.resolve_model is not None:
            resolved = ext.resolve_model(arg)
            if resolved is not None:
                return resolved
    return arg


def declare_installed_settings() -> None:
    """Declare the settings of every installed extension without activating any (``omni-info``
    checks every declared variable, including those of extensions it does not activate)."""
    for ep in entry_points(group=EXTENSION_GROUP):
        _load(ep)


def active_extensions() -> dict[str, str]:
    """The extensions :func:`activate` ran in this process (empty before it ran)."""
    return dict(_active)


def current_platform_qualname() -> str:
    """Dotted name of the class of ``vllm.platforms.current_platform`` (resolves it if needed)."""
    from vllm.platforms import current_platform

    cls = type(current_platform)
    return f"{cls.__module__}.{cls.__qualname__}"


def activate() -> dict[str, str]:
    """Activate each installed extension once in this process; return the active ones.

    Raises:
        OmniNotActiveError: the current platform is not OmniPlatform (with the reason the
            omni platform plugin gave, when it declined).
        TypeError: an entry point does not return an :class:`Extension`.
        Exception: whatever an extension's activation raises (never swallowed).
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
    from omni_platform.cache_root import ensure_writable

    ensure_writable()  # C21: before vLLM writes its first cache file
    loaded = [(ep, _load(ep)) for ep in entry_points(group=EXTENSION_GROUP)]
    unknown = envs.unknown_omni_variables()  # after the extensions declared theirs
    if unknown:
        logger.warning(
            "omni: ignoring undeclared environment variable(s) %s; declared: %s",
            unknown, ", ".join(sorted(envs.SETTINGS)),
        )
    for ep, ext in loaded:
        ext.activate()
        _extensions[ext.name] = ext
        _active[ext.name] = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else ext.distribution
    _activated = True
    from omni_platform.malloc_tuning import apply as fix_mmap_threshold
    from omni_platform.malloc_tuning import start_trimmer

    threshold = fix_mmap_threshold()  # freed temporaries back to the OS, here and in spawned processes
    if threshold is not None:
        logger.debug("omni: glibc malloc's mmap threshold fixed at %d bytes", threshold)
    start_trimmer()  # free pages inside glibc's heap back to the OS every OMNI_MALLOC_TRIM_S seconds (C27)
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
