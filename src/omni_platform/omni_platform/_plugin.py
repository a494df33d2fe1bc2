"""Entry points vLLM calls: ``vllm.platform_plugins`` and ``vllm.general_plugins``, both named ``omni``.

Both are cheap: the platform hook returns a dotted path (vLLM imports the class
later), the general hook defers to :func:`omni_platform.extensions.activate`.
vLLM keys plugins by entry-point name and loads them in every process (front end,
engine core, worker; ``vllm/plugins/__init__.py``, vLLM 0.28), so omni declares one
general plugin only, here, and the other omni distributions hook in through the
``omni.extensions`` entry-point group that it walks.
"""

from __future__ import annotations

import logging

__all__ = ["PLATFORM_QUALNAME", "platform_decline_reason", "register_general", "register_platform"]

PLATFORM_QUALNAME = "omni_platform.platform.OmniPlatform"

logger = logging.getLogger("vllm.omni_platform")

_decline_reason: str | None = None


def register_platform() -> str | None:
    """Return OmniPlatform's dotted path where vLLM's CPU platform would activate, else ``None``.

    vLLM's detection (``vllm.platforms.cpu_platform_plugin``) decides; when it declines,
    the reason is kept for :func:`platform_decline_reason` and logged, and the general
    plugin refuses to run omni extensions on another platform.
    """
    global _decline_reason
    from vllm.platforms import cpu_platform_plugin

    stock = cpu_platform_plugin()
    if stock is None:
        _decline_reason = (
            "vLLM's CPU platform would not activate here (the installed vLLM is not a CPU "
            "build, VLLM_TARGET_DEVICE is not 'cpu', and this is not macOS)"
        )
        logger.warning("omni platform plugin not activated: %s", _decline_reason)
        return None
    if stock != "vllm.platforms.cpu.CpuPlatform":
        logger.warning("omni: OmniPlatform replaces %s (it extends the plain CpuPlatform)", stock)
    _decline_reason = None
    return PLATFORM_QUALNAME


def platform_decline_reason() -> str | None:
    """Why :func:`register_platform` declined in this process, or ``None``."""
    return _decline_reason


def register_general() -> None:
    """vLLM's general-plugin hook: activate every installed omni extension in this process."""
    from omni_platform.extensions import activate

    activate()
