"""Where the worker's anonymous memory goes: a ledger of tensor storages.

    python -m harness ledger [--model smollm2-135m] [--quantization Q] [--enforce-eager]

Inside the real worker (through ``collective_rpc``) it lists every tensor storage
reachable from the model (parameters and buffers, ``remove_duplicate=False`` so that a
tied output head is seen, then counted once by ``data_ptr``), the KV cache tensors and
any other live tensor, groups them (weights by dtype or quant kind, output head,
embedding, KV cache, RoPE tables, other), names the largest, and measures how much of
each is resident with ``mincore(2)``. The worker's RssAnon minus the resident tensor
bytes is printed as the unexplained remainder, not hidden. Last stdout line: JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import mmap
import os
import sys
import time
from typing import Any

from harness import provenance

__all__ = ["group_of", "ledger", "main", "resident_bytes"]

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


def ledger(worker: Any) -> dict[str, Any]:
    """Run inside a worker (``collective_rpc``): the ledger as a JSON-able dict (bytes)."""
    import torch

    model = worker.model_runner.model
    seen: dict[int, dict[str, Any]] = {}

    def add(name: str, t: torch.Tensor, is_kv: bool = False) -> None:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in seen:
            seen[ptr]["names"].append(name)
            return
        seen[ptr] = {"names": [name], "bytes": st.nbytes(), "dtype": str(t.dtype).removeprefix("torch."),
                     "group": group_of(name, str(t.dtype).removeprefix("torch."), is_kv)}

    for name, p in model.named_parameters(remove_duplicate=False):
        add(name, p)
    for name, b in model.named_buffers(remove_duplicate=False):
        add(name, b)
    for i, t in enumerate(worker.model_runner.kv_caches):
        if isinstance(t, torch.Tensor):
            add(f"kv_cache[{i}]", t, is_kv=True)
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.untyped_storage().nbytes():
                add(f"other:{tuple(obj.shape)}", obj)
        except Exception:  # tensors without storage (meta, sparse...) are not memory here
            continue
    groups: dict[str, dict[str, int]] = {}
    for ptr, e in seen.items():
        e["resident"] = resident_bytes(ptr, e["bytes"])
        g = groups.setdefault(e["group"], {"bytes": 0, "resident": 0, "storages": 0})
        g["bytes"] += e["bytes"]
        g["resident"] += e["resident"]
        g["storages"] += 1
    with open("/proc/self/status") as f:
        rss_anon = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("RssAnon:"))
    resident_total = sum(e["resident"] for e in seen.values())
    largest = sorted(seen.values(), key=lambda e: -e["bytes"])[:10]
    return {
        "pid": os.getpid(),
        "rss_anon": rss_anon,
        "tensor_resident": resident_total,
        "unexplained": rss_anon - resident_total,
        "groups": groups,
        "largest": [{"names": e["names"][:3], "bytes": e["bytes"], "resident": e["resident"], "dtype": e["dtype"],
                     "group": e["group"]} for e in largest],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness ledger", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--out", default=None, help="also write every worker's ledger as a JSON artifact here")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from harness.models.registry import MODELS, fetch

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    prov, labels = provenance.begin_or_exit(args.out, "ledger", checkpoints=(model,), allow_dirty=args.allow_dirty)
    from vllm import LLM

    from harness.models.recipe import EngineRecipe

    llm = LLM(**EngineRecipe.from_args(model, args, max_num_seqs=4).llm_kwargs())
    workers = llm.collective_rpc(ledger)
    for w in workers:
        print(f"worker {w['pid']}: RssAnon {w['rss_anon'] / MiB:.1f} MiB, tensors resident "
              f"{w['tensor_resident'] / MiB:.1f} MiB, unexplained {w['unexplained'] / MiB:.1f} MiB")
        for g, v in sorted(w["groups"].items(), key=lambda kv: -kv[1]["bytes"]):
            print(f"  {g:20s} {v['bytes'] / MiB:9.1f} MiB  resident {v['resident'] / MiB:9.1f} MiB  "
                  f"({v['storages']} storages)")
        for e in w["largest"][:5]:
            print(f"  largest: {e['names'][0]} {e['bytes'] / MiB:.1f} MiB {e['dtype']}")
        print(json.dumps(w), flush=True)
    if args.out:
        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {"kind": "memory_ledger", "created_unix": time.time(), "model": model,
                                             "params": vars(args), "workers": workers,
                                             "provenance": prov, "labels": labels})
        print(f"artifact: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
