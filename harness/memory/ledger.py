"""Where each process's anonymous memory goes: RssAnon partitioned into named items.

    python -m harness ledger [--model smollm2-135m] [--layout llm|server] [--quantization Q]
        [--enforce-eager] [--release] [--out FILE]

Inside the real worker (through ``collective_rpc``) it lists every tensor storage
reachable from the model (parameters and buffers, ``remove_duplicate=False`` so that a
tied output head is seen, then counted once by ``data_ptr``), the KV cache tensors and
any other live tensor, groups them (weights by dtype or quant kind, output head,
embedding, KV cache, RoPE tables, other), names the largest, and measures how much of
each is resident with ``mincore(2)``. Beside the tensors it names what else holds RssAnon: pages
written into mapped files and stacks (``/proc/self/smaps``, :mod:`harness.memory.smaps`), CPython's
object arenas, and what malloc has in use and keeps free (:mod:`harness.memory.allocators`). What the
items do not cover is printed as the unexplained remainder, not hidden. ``--layout server`` asks a
running ``omni-vllm serve``'s worker the same through vLLM's dev endpoint, and reads its front end from
outside (mapping kinds only). One JSON line per process.
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import gc
import json
import mmap
import os
import sys
import time
import tracemalloc
from typing import Any

from harness import provenance
from omni_platform.procfs import status_bytes

__all__ = ["account", "group_of", "LedgerExtension", "ledger", "main", "outside", "resident_bytes"]

MiB = 1 << 20
PAGE = mmap.PAGESIZE


def resident_bytes(addr: int, nbytes: int) -> int:
    """Bytes of ``[addr, addr + nbytes)`` resident in RAM, by ``mincore(2)`` (page granularity)."""
    if nbytes <= 0 or addr == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    start = addr - addr % PAGE
    length = addr + nbytes - start
    pages = (length + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
        return 0  # not a mapping mincore can inspect
    return sum(1 for b in vec if b & 1) * PAGE


def group_of(name: str, dtype: str, is_kv: bool = False) -> str:
    """The ledger group of a named tensor."""
    if is_kv:
        return "kv_cache"
    if "lm_head" in name:
        return "output_head"
    if "embed_tokens" in name:
        return "embedding"
    if "rotary" in name or "cos_sin" in name:
        return "rope_tables"
    if name.startswith("other:"):
        return "other"
    return f"weights:{dtype}"


def _storages(model: Any, kv_caches: Any) -> dict[int, dict[str, Any]]:
    """Every live CPU tensor storage: the model's parameters and buffers (``remove_duplicate=False``, so
    that a tied head is seen), the KV cache tensors, then any other tensor the garbage collector
    tracks; keyed by ``data_ptr``, so a storage viewed twice is counted once."""
    import torch

    seen: dict[int, dict[str, Any]] = {}

    def add(name: str, t: torch.Tensor, is_kv: bool = False) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in seen:
            seen[ptr]["names"].append(name)
            return
        dtype = str(t.dtype).removeprefix("torch.")
        # torch's CPU allocator makes resizable storages (malloc'd); frombuffer/mmap ones are not
        seen[ptr] = {"names": [name], "bytes": st.nbytes(), "dtype": dtype, "malloc": bool(st.resizable()),
                     "group": group_of(name, dtype, is_kv)}

    if model is not None:
        for name, p in model.named_parameters(remove_duplicate=False):
            add(name, p)
        for name, b in model.named_buffers(remove_duplicate=False):
            add(name, b)
    for i, t in enumerate(kv_caches or ()):
        if isinstance(t, torch.Tensor):
            add(f"kv_cache[{i}]", t, is_kv=True)
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.untyped_storage().nbytes():
                add(f"other:{tuple(obj.shape)}", obj)
        except Exception:  # tensors without storage (meta, sparse...) are not memory here
            continue
    return seen


def _mapping_of(maps: list, addr: int):
    """The mapping holding ``addr`` (``maps`` in address order), or None."""
    i = bisect.bisect_right([m.start for m in maps], addr) - 1
    return maps[i] if i >= 0 and maps[i].start <= addr < maps[i].end else None


KINDS_NAMED = {
    "file": "pages written into mapped files (libraries' data and relocations)",
    "heap": "[heap]: glibc's main malloc arena (brk)",
    "malloc_arena": "glibc thread arenas (64 MiB heaps)",
    "stack": "[stack]", "thread_stack": "thread stacks",
    "anon": "other anonymous mappings (malloc's own mmaps, Python arenas, torch/oneDNN, our weight arenas)",
    "special": "[vdso] and the like",
}


def account(model: Any = None, kv_caches: Any = (), release: bool = False) -> dict[str, Any]:
    """The ledger of this process (run inside it), bytes: RssAnon partitioned into named items.

    Items: ``tensors`` (resident bytes of live tensor storages in anonymous memory, by group),
    ``file_anon`` (pages written into mapped files, largest files named), ``stacks``, ``python_arenas``
    (pymalloc), ``malloc_other`` (bytes malloc has handed out minus the malloc'd tensor storages: C++
    objects, Python objects over 512 bytes, buffers of libraries), ``allocator_free`` (free bytes the
    mallocs keep); ``unexplained`` is RssAnon minus their sum (negative when an item over-counts: the
    free bytes are an upper bound of what is resident). Also ``anon_by_kind`` (smaps, the cross-check),
    ``tensor_file_resident`` (tensor bytes on file pages: mapped weights), ``groups`` and ``largest``
    (the 10 largest storages). With ``release``: ``released`` from :func:`allocators.release`, measured
    after everything else.
    """
    from harness.memory import allocators
    from harness.memory.smaps import read_smaps

    seen = _storages(model, kv_caches)
    maps = read_smaps("self")
    rss_anon = status_bytes("RssAnon")
    groups: dict[str, dict[str, int]] = {}
    tensor_anon = tensor_file = malloc_tensors = 0
    covered: dict[int, int] = {}  # mapping start -> resident tensor bytes in it
    for ptr, e in seen.items():
        e["resident"] = resident_bytes(ptr, e["bytes"])
        m = _mapping_of(maps, ptr)
        if m is not None:
            covered[m.start] = covered.get(m.start, 0) + e["resident"]
        e["on_file"] = m is not None and m.kind == "file"
        if e["on_file"]:
            tensor_file += e["resident"]
        else:
            tensor_anon += e["resident"]
        if e["malloc"]:
            malloc_tensors += e["bytes"]
        g = groups.setdefault(e["group"], {"bytes": 0, "resident": 0, "storages": 0})
        g["bytes"] += e["bytes"]
        g["resident"] += e["resident"]
        g["storages"] += 1
    by_kind: dict[str, int] = {}
    files: dict[str, int] = {}
    for m in maps:
        by_kind[m.kind] = by_kind.get(m.kind, 0) + m.anonymous
        if m.kind == "file" and m.anonymous:
            name = os.path.basename(m.path)
            files[name] = files.get(name, 0) + m.anonymous
    glibc, tc, py = allocators.glibc_malloc(), allocators.tcmalloc(), allocators.pymalloc()
    malloc_in_use = (glibc or {}).get("in_use", 0) + ((tc or {}).get("in_use") or 0)
    free_held = (glibc or {}).get("free_held", 0) + sum((tc or {}).get(k) or 0 for k in (
        "free_held", "central_cache_free", "transfer_cache_free", "thread_cache_free"))
    items = {
        "tensors": tensor_anon,
        "file_anon": by_kind.get("file", 0),
        "stacks": by_kind.get("stack", 0) + by_kind.get("thread_stack", 0),
        "python_arenas": py["arenas_mapped"] or 0,
        "malloc_other": max(0, malloc_in_use - malloc_tensors),
        "allocator_free": free_held,
    }
    largest = sorted(seen.values(), key=lambda e: -e["bytes"])[:10]
    bare = sorted(((m.anonymous - covered.get(m.start, 0), m) for m in maps if m.kind in ("anon", "heap")),
                  key=lambda um: -um[0])[:10]
    out = {
        "pid": os.getpid(),
        "rss_anon": rss_anon,
        "rss_file": status_bytes("RssFile"),
        "items": items,
        "unexplained": rss_anon - sum(items.values()),
        "tensor_resident": tensor_anon + tensor_file,
        "tensor_file_resident": tensor_file,
        "malloc": {"glibc": glibc, "tcmalloc": tc, "in_use": malloc_in_use, "tensors_malloced": malloc_tensors},
        "pymalloc": py,
        "anon_by_kind": by_kind,
        "file_anon_largest": dict(sorted(files.items(), key=lambda kv: -kv[1])[:8]),
        # the anonymous mappings with the most resident bytes no live tensor accounts for
        "anon_mappings_without_tensors": [{"start": hex(m.start), "size": m.size, "anonymous": m.anonymous,
                                           "not_tensors": u, "kind": m.kind} for u, m in bare],
        "groups": groups,
        "largest": [{"names": e["names"][:3], "bytes": e["bytes"], "resident": e["resident"], "dtype": e["dtype"],
                     "group": e["group"], "on_file": e["on_file"]} for e in largest],
    }
    if tracemalloc.is_tracing():
        out["python_heap_by_package"] = python_heap_by_package()
    if release:
        out["released"] = allocators.release()
    return out


def _package_of(filename: str) -> str:
    """The distribution-level name of a source file: ``site-packages/<pkg>/...`` -> ``pkg``, the
    standard library -> ``stdlib``, omni's own sources -> their package, ``<frozen ...>`` and the like
    -> the name itself."""
    parts = filename.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            return parts[i + 1].removesuffix(".py") if i + 1 < len(parts) else marker
    for own in ("omni_platform", "omni_quant", "omni_patches", "harness", "tests"):
        if own in parts:
            return own
    if "python3" in filename and "lib" in parts:
        return "stdlib"
    return filename if filename.startswith("<") else "other"


TRACE_FRAMES = 32
"""Frames ``tracemalloc`` keeps per allocation: enough to get past importlib to the importing module."""


def python_heap_by_package(limit: int = 15) -> dict[str, int]:
    """Bytes of live Python allocations by the package whose code made them, largest first.

    ``tracemalloc`` (started with :data:`TRACE_FRAMES` frames before the imports: ``python -m harness
    ledger --tracemalloc``) groups by traceback; each allocation counts against the innermost frame
    outside importlib's frozen modules, so a module's code objects, unmarshalled by importlib, count
    against the package whose ``import`` statement loaded it (for a package's own submodules: itself).
    ``(total traced)`` is the sum."""
    snap = tracemalloc.take_snapshot()
    by: dict[str, int] = {}
    for st in snap.statistics("traceback"):
        frames = [f.filename for f in st.traceback]  # innermost first
        own = next((f for f in frames if not f.startswith("<frozen")), frames[0])
        pkg = _package_of(own)
        by[pkg] = by.get(pkg, 0) + st.size
    by["(total traced)"] = sum(by.values())
    return dict(sorted(by.items(), key=lambda kv: -kv[1])[:limit + 1])


def ledger(worker: Any, release: bool = False) -> dict[str, Any]:
    """Run inside a worker (``collective_rpc``): :func:`account` of its model and KV cache."""
    return account(worker.model_runner.model, worker.model_runner.kv_caches, release)


class LedgerExtension:
    """A vLLM worker extension (``--worker-extension-cls harness.memory.ledger.LedgerExtension``): adds
    ``omni_ledger`` to the worker, so a running server's engine core can be asked through vLLM's dev
    endpoint ``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``, ``vllm/entrypoints/serve/dev/rpc``)."""

    def omni_ledger(self, release: str = "") -> dict[str, Any]:
        """:func:`ledger` of this worker; ``release="1"`` also measures the allocators' release."""
        return ledger(self, release == "1")


def outside(pid: int) -> dict[str, Any]:
    """What can be said of a process from outside it (an engine core): RssAnon, RssFile and its anonymous
    pages by mapping kind (:mod:`harness.memory.smaps`), bytes."""
    from harness.memory.smaps import read_smaps

    by_kind: dict[str, int] = {}
    for m in read_smaps(pid):
        by_kind[m.kind] = by_kind.get(m.kind, 0) + m.anonymous
    return {"pid": pid, "rss_anon": status_bytes("RssAnon", pid), "rss_file": status_bytes("RssFile", pid),
            "anon_by_kind": by_kind}


def _print(role: str, w: dict[str, Any]) -> None:
    print(f"{role} (pid {w['pid']}): RssAnon {w['rss_anon'] / MiB:.1f} MiB, RssFile {w['rss_file'] / MiB:.1f} MiB")
    if "items" not in w:
        for k, v in sorted(w["anon_by_kind"].items(), key=lambda kv: -kv[1]):
            print(f"  {KINDS_NAMED.get(k, k):70s} {v / MiB:9.1f} MiB")
        return
    for k, v in w["items"].items():
        print(f"  {ITEMS_NAMED[k]:70s} {v / MiB:9.1f} MiB")
    print(f"  {'unexplained (RssAnon minus the items above)':70s} {w['unexplained'] / MiB:9.1f} MiB "
          f"({100 * w['unexplained'] / max(1, w['rss_anon']):.1f}% of RssAnon)")
    if w["tensor_file_resident"]:
        print(f"  tensors on file pages (RssFile, not RssAnon): {w['tensor_file_resident'] / MiB:.1f} MiB")
    for g, v in sorted(w["groups"].items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"    tensors {g:20s} {v['bytes'] / MiB:9.1f} MiB  resident {v['resident'] / MiB:9.1f} MiB  "
              f"({v['storages']} storages)")
    for name, v in list(w["file_anon_largest"].items())[:5]:
        print(f"    written pages of {name}: {v / MiB:.1f} MiB")
    for k, v in sorted(w["anon_by_kind"].items(), key=lambda kv: -kv[1]):
        print(f"    smaps {KINDS_NAMED.get(k, k):66s} {v / MiB:9.1f} MiB")
    for b in w.get("anon_mappings_without_tensors", [])[:5]:
        print(f"    mapping {b['start']} ({b['kind']}, {b['size'] / MiB:.1f} MiB): {b['not_tensors'] / MiB:.1f} MiB "
              "resident that no live tensor accounts for")
    for name, v in w.get("python_heap_by_package", {}).items():
        print(f"    Python heap of {name}: {v / MiB:.1f} MiB")
    if "released" in w:
        print(f"  the allocators' release then returned {w['released']['returned'] / MiB:.1f} MiB of RssAnon")


ITEMS_NAMED = {
    "tensors": "tensors resident in anonymous memory (by group below)",
    "file_anon": "pages written into mapped files (libraries' data, relocations)",
    "stacks": "thread and main stacks",
    "python_arenas": "CPython object arenas (pymalloc)",
    "malloc_other": "malloc in use, not tensors (C++ objects, Python objects > 512 B)",
    "allocator_free": "free bytes the mallocs keep (upper bound of what is resident)",
}


def _server(model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``omni-vllm serve`` with the ledger in its front end (:mod:`harness.memory.frontend`) and in its
    engine core's worker (:class:`LedgerExtension`); the tree's other processes from outside."""
    import tempfile

    from harness import REPO
    from harness.models.recipe import EngineRecipe
    from harness.server_process import Server

    out = tempfile.mktemp(prefix="omni-ledger-", suffix=".json")

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "harness.memory.frontend", out, str(port),
                *(["--release"] if args.release else []), "--", "serve", model, "--served-model-name", "m",
                "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats",
                "--worker-extension-cls", "harness.memory.ledger.LedgerExtension",
                *EngineRecipe.from_args(model, args, max_num_seqs=4).serve_args()]

    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    log = REPO / ".cache" / f"ledger-server-{os.getpid()}.log"
    # the ledger file, not /health, says the server is done: the front end writes it after its first request
    with Server.start(cmd, log, env=env, cwd=REPO, timeout_s=None) as server:
        t0 = time.monotonic()
        while not os.path.exists(out):
            if server.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({server.proc.returncode}) before its ledger; see {log}")
            if time.monotonic() - t0 > 1900:
                raise TimeoutError(f"no ledger from the server within 1900 s; see {log}")
            time.sleep(2)
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    if "error" in result:
        raise RuntimeError(f"the server's ledger failed:\n{result['error']}")
    return ([{**result["front_end"], "role": "front end (API server)"}]
            + [{**w, "role": "engine core + worker"} for w in result["workers"]]
            + [{**o, "role": f"{o['role']} (read from outside)"} for o in result["others"]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness ledger", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layout", choices=("llm", "server", "import"), default="llm",
                    help="llm: vllm.LLM in omni's one-process layout (this process); server: omni-vllm serve "
                         "(front end + engine core); import: only `import vllm.entrypoints.openai.api_server` "
                         "(what the server's front end holds before any model)")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--release", action="store_true",
                    help="after the ledger, ask the mallocs to return free memory and report what came back")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="trace Python allocations from before vLLM's import and attribute the Python heap by "
                         "package (the server layout: its front end; slows start-up about 2x)")
    ap.add_argument("--out", default=None, help="also write every process's ledger as a JSON artifact here")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    if args.tracemalloc:
        if args.layout == "server":
            os.environ["OMNI_LEDGER_TRACEMALLOC"] = "1"
        else:
            tracemalloc.start(TRACE_FRAMES)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from harness.models.registry import MODELS, fetch

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    prov, labels = provenance.begin_or_exit(args.out, "ledger", checkpoints=(model,), allow_dirty=args.allow_dirty)
    if args.layout == "server":
        processes = _server(model, args)
    elif args.layout == "import":
        import vllm.entrypoints.openai.api_server  # noqa: F401 - the measured import

        processes = [{**account(release=args.release), "role": f"import only ({len(sys.modules)} modules)"}]
    else:
        from vllm import LLM, SamplingParams

        from harness.models.recipe import EngineRecipe

        llm = LLM(**EngineRecipe.from_args(model, args, max_num_seqs=4).llm_kwargs())
        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)
        workers = llm.collective_rpc(ledger, kwargs={"release": args.release})
        worker_pids = {w["pid"] for w in workers}
        processes = [{**w, "role": "front end + engine core + worker" if w["pid"] == os.getpid() else "worker"}
                     for w in workers]
        if os.getpid() not in worker_pids:  # vLLM's multiprocess layout: this process is only the front end
            processes.append({**account(release=args.release), "role": "front end"})
    for w in processes:
        _print(w["role"], w)
        print(json.dumps(w), flush=True)
    if args.out:
        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {"kind": "memory_ledger", "created_unix": time.time(), "model": model,
                                             "params": vars(args), "workers": processes,
                                             "provenance": prov, "labels": labels})
        print(f"artifact: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
