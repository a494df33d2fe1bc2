"""A start-up profile: one start of ``vllm.LLM`` or ``omni-vllm serve``, launch to first token, by phase.

    python -m harness startup --model smollm2-135m-int4 [--server] [--cold] [--enforce-eager]
        [--kv-cache-memory-bytes N] [--cache-root DIR] [--out harness/results/startup_MODEL-STAMP.json]

The start runs in a child process with ``VLLM_LOGGING_PREFIX`` set (:mod:`harness.startup.phases`), so
every log line of every process carries its pid and a microsecond time stamp; the phases between the
markers are printed as a table and written to ``--out`` with the CPU flags and labels.

*Warm* (the default): the compile cache (``VLLM_CACHE_ROOT``, ``--cache-root``, default
``.cache/startup/MODEL-compiled|eager``) and omni's layout file already exist; when the cache is
empty, one start runs first to fill it and is not profiled (its seconds are in the artifact as
``preparing_start_s``). *Cold* (``--cold``): an empty compile cache of its own (the layout file, beside
the checkpoint, may exist: remove ``omni-layouts/`` for a start that also repacks).

The launch-to-first-token the client measures on its own clock (``time.perf_counter`` from ``Popen``
to the first token it sees) is beside the phases' sum (:func:`harness.startup.phases.check_total`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.startup.phases import (
    END,
    FIRST_REQUEST,
    LAUNCH,
    LOG_PREFIX,
    Marker,
    check_total,
    markers_from_log,
    phases,
)

__all__ = ["main", "profile_start"]

HEALTH_POLL_S = 0.05


def _ctimes(root: int, into: dict[int, float]) -> None:
    """Record the create time (psutil, unix s) of ``root`` and its descendants that are alive now, by pid
    (``into[0]`` is the wall clock the runner took just before launching ``root``)."""
    import psutil

    try:
        p = psutil.Process(root)
        for q in [p, *p.children(recursive=True)]:
            into.setdefault(q.pid, q.create_time())
    except psutil.Error:
        pass


def _env(cache_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_PLUGINS", "omni")
    env.update(VLLM_LOGGING_PREFIX=LOG_PREFIX, VLLM_CACHE_ROOT=str(cache_root), VLLM_LOGGING_COLOR="0",
               VLLM_CONFIGURE_LOGGING="1")
    return env


def _run_llm(model: str, args: argparse.Namespace, env: dict[str, str], log: Path,
             timeout_s: float) -> tuple[int, float, list[Marker], dict[int, float]]:
    """The ``vllm.LLM`` start; returns (root pid, client-measured seconds, the client's markers, create times)."""
    cmd = [sys.executable, "-m", "harness.startup.child", "--model", model,
           "--max-model-len", str(args.max_model_len)]
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    if args.kv_cache_memory_bytes:
        cmd += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    ctimes: dict[int, float] = {}
    with open(log, "w") as f:
        launched, ctimes[0] = time.perf_counter(), time.time()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=_repo())
    seen = None
    deadline = launched + timeout_s
    while time.perf_counter() < deadline:
        _ctimes(proc.pid, ctimes)
        if seen is None and "startup: first token" in log.read_text(errors="replace"):
            seen = time.perf_counter()
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    else:
        proc.kill()
        raise RuntimeError(f"no first token within {timeout_s:.0f} s; see {log}")
    if proc.returncode != 0 or seen is None:
        raise RuntimeError(f"the profiled vllm.LLM start exited with status {proc.returncode}; see {log}")
    return proc.pid, seen - launched, [], ctimes


def _run_server(model: str, args: argparse.Namespace, env: dict[str, str], log: Path,
                timeout_s: float) -> tuple[int, float, list[Marker], dict[int, float]]:
    """The ``omni-vllm serve`` start: /health polled every :data:`HEALTH_POLL_S`, then one streamed request."""
    from harness.arms.server import serve_command
    from harness.server_process import Server, stream_times

    ctimes: dict[int, float] = {}
    # the END marker is the server's own "Received request" line (--enable-log-requests)
    server = Server.start(lambda port: [*serve_command(model, port, args), "--enable-log-requests"], log, env=env,
                         timeout_s=None)
    launched, ctimes[0], proc = server.launched, server.launched_unix, server.proc
    with server:
        server.wait_healthy(timeout_s, HEALTH_POLL_S, lambda: _ctimes(proc.pid, ctimes))
        healthy = server.healthy_unix
        first = {"model": "m", "temperature": 0.0, "prompt": [100 + i for i in range(8)], "max_tokens": 1}
        times, _ = stream_times(server.base + "/v1/completions", first)
        measured = times[0] - launched
    client = [Marker(healthy, proc.pid, FIRST_REQUEST, "the harness: /health answered 200")]
    return proc.pid, measured, client, ctimes


def _repo() -> str:
    return str(Path(__file__).resolve().parents[2])


def profile_start(model: str, args: argparse.Namespace, cache_root: Path, log: Path) -> dict[str, Any]:
    """One profiled start of ``model`` (a checkpoint directory) with ``VLLM_CACHE_ROOT=cache_root``.

    Returns a dict: ``phases`` (process role, label, start offset from the launch and seconds, s),
    ``total_s`` (their sum), ``measured_s`` (the client's launch to first token), ``gap`` (relative),
    ``markers`` (the log lines that bound the phases), ``pids`` (role per pid).

    Raises:
        RuntimeError: the start failed or timed out (the message names the log).
        ValueError: the phases do not sum to the measured seconds within 10%.
    """
    run = _run_server if args.server else _run_llm
    root, measured, client, ctimes = run(model, args, _env(cache_root), log, args.timeout)
    logged = markers_from_log(log.read_text(errors="replace").splitlines())
    pids = {root} | {m.pid for m in logged}
    # The root's launch is the wall clock just before Popen (ctimes[0]). psutil's create time counts from
    # the boot time, which /proc/stat gives in whole seconds; the difference of two create times is exact
    # to a clock tick, so the other processes' launches are placed relative to the root's.
    t0 = ctimes[0]
    launches = [Marker(t0 + ctimes[p] - ctimes[root], p, LAUNCH, None) for p in pids if p != root and p in ctimes]
    launches.append(Marker(t0, root, LAUNCH, None))
    markers = [*launches, *logged, *client]
    timeline = phases(markers)
    end = next((i for i, p in enumerate(timeline) if p.label == END), None)
    if end is not None:  # a marker after the first token (the engine shutting down) is not the start
        timeline = timeline[:end]
    roles = {p: ("front end" if args.server else "vllm.LLM") if p == root else
             ("engine core" if args.server else "worker") for p in pids}
    gap = check_total(timeline, measured)
    return {"phases": [{"process": roles[p.pid], "pid": p.pid, "label": p.label, "at_s": p.start - t0,
                        "seconds": p.seconds} for p in timeline],
            "total_s": sum(p.seconds for p in timeline), "measured_s": measured, "gap": gap,
            "markers": [{"t_s": m.t - t0, "pid": m.pid, "label": m.label, "line": m.line}
                        for m in sorted(markers, key=lambda m: m.t)],
            "pids": {str(p): r for p, r in roles.items()}}


def _table(result: dict[str, Any]) -> str:
    rows = [f"{'at (s)':>7} {'seconds':>8}  {'process':<12} phase"]
    for p in result["phases"]:
        rows.append(f"{p['at_s']:7.2f} {p['seconds']:8.2f}  {p['process']:<12} {p['label']}")
    rows.append(f"{'':7} {result['total_s']:8.2f}  total (the client measured {result['measured_s']:.2f} s)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from harness import provenance

    ap = argparse.ArgumentParser(prog="python -m harness startup", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-int4",
                    help="a harness.models.registry name or a checkpoint directory")
    ap.add_argument("--server", action="store_true", help="profile `omni-vllm serve` instead of vllm.LLM")
    ap.add_argument("--cold", action="store_true", help="an empty compile cache (VLLM_CACHE_ROOT) of its own")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=256 << 20)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--cache-root", type=Path, default=None,
                    help="VLLM_CACHE_ROOT of a warm start (default .cache/startup/MODEL-compiled|eager)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to the first token")
    ap.add_argument("--out", type=Path, default=None, help="write the artifact here")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)

    from harness.arms.server import wait_for_compile_ahead
    from harness.arms.start import cache_is_empty
    from harness.models.registry import MODELS, fetch

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    name = Path(model).name
    mode = "eager" if args.enforce_eager else "compiled"
    prov, labels = provenance.begin_or_exit(args.out, "startup", checkpoints=(model,), allow_dirty=args.allow_dirty)
    work = Path(_repo()) / ".cache" / "startup"
    work.mkdir(parents=True, exist_ok=True)
    preparing = None
    if args.cold:
        cache_root = Path(tempfile.mkdtemp(prefix=f"{name}-{mode}-cold-", dir=work))
    else:
        cache_root = args.cache_root or work / f"{name}-{mode}"
        if cache_is_empty(cache_root):
            t = time.perf_counter()
            profile_start(model, args, cache_root, work / f"{name}-{mode}-preparing.log")
            # A first compiled server start answers eager and compiles in a background process
            # (omni_platform.compile_ahead); the warm start is the one after that process has saved the artifact.
            wait_for_compile_ahead(args.timeout, cache_root)
            preparing = time.perf_counter() - t
    log = work / f"{name}-{mode}-{'server' if args.server else 'llm'}-{'cold' if args.cold else 'warm'}.log"
    result = profile_start(model, args, cache_root, log)
    print(_table(result))
    if args.out:
        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {
            "kind": "startup_profile", "created_unix": time.time(), "model": model,
            "layout": "server" if args.server else "llm", "mode": mode, "start": "cold" if args.cold else "warm",
            "cache_root": str(cache_root), "preparing_start_s": preparing, "log": str(log),
            **result, "provenance": prov, "labels": labels})
        print(f"wrote {args.out}")
    print(json.dumps({"total_s": result["total_s"], "measured_s": result["measured_s"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
