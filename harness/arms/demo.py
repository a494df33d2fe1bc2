"""``python -m harness run-demo``: the main job (``make demo``) from nothing but the installed packages, timed.

Every pass starts from empty caches of its own, made under the arm's ``VLLM_CACHE_ROOT``: the model cache
(``HARNESS_MODEL_CACHE``: the bundled SmolLM2 is converted to cpu_int4 again), vLLM's cache root (compile cache,
omni's kernel choice) and ``XDG_CACHE_HOME`` (omni's user layout cache). It runs ``python -m harness demo``
(what ``make demo`` runs once the virtual environment exists) and reports

- ``demo_cold_s``: seconds from launching the demo to its exit (the model converted, the server started,
  the chat answered and printed, the server stopped);

then kills the background compile the demo's first start left running (``omni_platform.compile_ahead``) and
removes the caches, so that the next pass competes with nothing. The demo's own printout (start-up seconds,
decode rate) is in the provenance as ``demo_output``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run one timed demo from empty caches; print one JSON line (``metrics``, ``provenance``)."""
    ap = argparse.ArgumentParser(prog="python -m harness run-demo", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-int4", help="the demo's --model")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds the demo may take")
    ap.add_argument("--from-clone", action="store_true",
                    help="time `make demo` in a fresh `git clone` of this repository's HEAD instead: the virtual "
                         "environment set up from the package index too (metric demo_from_clone_s)")
    args = ap.parse_args(argv)
    if args.from_clone:
        return _from_clone(args)

    root = _empty_root("demo-from-nothing-")
    env = {**os.environ, "HARNESS_MODEL_CACHE": os.path.join(root, "models"),
           "VLLM_CACHE_ROOT": os.path.join(root, "vllm"), "XDG_CACHE_HOME": os.path.join(root, "xdg")}
    return _timed("demo_cold_s", [sys.executable, "-m", "harness", "demo", "--model", args.model], env, root,
                  Path(env["HARNESS_MODEL_CACHE"]), args, {})


def _from_clone(args: argparse.Namespace) -> int:
    """``make demo`` in a fresh clone of HEAD with every cache empty (pip's, under ``XDG_CACHE_HOME``, included):
    what a newcomer's first command costs on this machine. ``demo_from_clone_s``: from the clone's start to
    ``make``'s exit."""
    repo = Path(__file__).resolve().parents[2]
    root = _empty_root("demo-from-clone-")
    clone = os.path.join(root, "omni")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HARNESS_MODEL_CACHE")}
    env.update(VLLM_CACHE_ROOT=os.path.join(root, "vllm"), XDG_CACHE_HOME=os.path.join(root, "xdg"))
    script = f"git clone --quiet {shlex.quote(str(repo))} {shlex.quote(clone)} && make -C {shlex.quote(clone)} demo"
    return _timed("demo_from_clone_s", ["bash", "-c", script], env, root, Path(clone) / ".cache" / "models", args,
                  {"cloned_sha": sha})


def _empty_root(prefix: str) -> str:
    base = os.environ.get("VLLM_CACHE_ROOT") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def _timed(metric: str, cmd: list[str], env: dict[str, str], root: str, models: Path, args: argparse.Namespace,
           extra: dict) -> int:
    """Run ``cmd`` (the demo) timed, kill the background compile it left, fingerprint the checkpoint it converted
    under ``models``, remove ``root``; print the JSON line (``metric`` in s). Returns the exit status (1: the demo
    failed, its output's tail on stderr)."""
    from harness.arms.server import kill_compile_ahead
    from harness.models.registry import checkpoint_dir
    from harness.provenance import checkpoint_fingerprint

    try:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        seconds = time.perf_counter() - t0
        os.environ["VLLM_CACHE_ROOT"] = env["VLLM_CACHE_ROOT"]
        killed = kill_compile_ahead()
        if proc.returncode == 0:  # the checkpoint the demo converted, fingerprinted before it is removed
            model = checkpoint_dir(args.model, models)
            size, sha = checkpoint_fingerprint(model)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith(("engine start-up", "decode", "  omni"))]
    print(json.dumps({"metrics": {metric: seconds}, "provenance": {
        "platform": None, "worker_threads": None, "worker_cpus": None, "head_dtype": None, "patches": None,
        "not_observed": "the demo's server is a child of a child: its own printout is in demo_output",
        "model": args.model, "model_path": str(model), "model_bytes": size, "model_sha256": sha,
        "quantization": "cpu_int4 (converted by the demo)", "demo_output": out, "compile_ahead": killed,
        **extra}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
