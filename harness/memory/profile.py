"""Per-op self time of one decode step, measured inside the worker with torch.profiler.

    python -m harness profile [--model smollm2-135m] [--prompt-len 512] [--decode-steps 16]
        [--quantization Q] [--enforce-eager] [--out harness/results/profile_MODEL-STAMP.json]

Two profiled requests on the same prompt: A generates 1 token (prefill only), B
generates ``1 + decode_steps``. Per op, (self CPU time of B - of A) / decode_steps is the
self time of that op in one decode step at depth ``prompt_len``. Ops are grouped into
GEMM, attention, norms and other; the last stdout line is JSON (microseconds). ``--out`` also writes
it as an artifact with the CPU model and flags, the versions and the per-op table.
``step_wall_us`` is the wall time of one decode step without the profiler: (best of three unprofiled runs of
B - best of three of A) / decode_steps, through ``vllm.LLM`` (scheduler, engine core and worker together); what
it holds beyond the ops' self time is Python and scheduling between the ops.
This is the tool that separates arms whose end-to-end numbers are NOT A RANKING.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from harness import provenance

__all__ = ["classify", "main"]

_GEMM = ("mm", "addmm", "linear", "matmul", "bmm", "int4pack", "gemm", "onednn", "mkldnn")
_ATTN = ("attn", "attention", "paged", "sdpa", "reshape_and_cache")
_NORM = ("rms_norm", "layer_norm", "norm")

_profiler = None


def classify(op: str) -> str:
    """Group of an op name: ``gemm``, ``attention``, ``norm`` or ``other``."""
    name = op.lower().split("::")[-1]
    if any(k in op.lower() for k in _ATTN):
        return "attention"
    if any(k in name for k in _NORM):
        return "norm"
    if any(name == k or name.startswith(k) or k in name for k in _GEMM):
        return "gemm"
    return "other"


def start(worker: Any) -> None:
    """Inside the worker: start a CPU profiler."""
    import torch

    global _profiler
    _profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    _profiler.__enter__()


def stop(worker: Any) -> dict[str, float]:
    """Inside the worker: stop the profiler; self CPU time per op key, microseconds."""
    global _profiler
    prof = _profiler
    prof.__exit__(None, None, None)
    _profiler = None
    return {e.key: float(e.self_cpu_time_total) for e in prof.key_averages()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness profile", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--out", default=None, help="also write the result as a JSON artifact here")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from harness.models.registry import MODELS, fetch

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    prov, labels = provenance.begin_or_exit(args.out, "profile", checkpoints=(model,), allow_dirty=args.allow_dirty)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.models.recipe import EngineRecipe

    llm = LLM(**EngineRecipe.from_args(model, args, max_num_seqs=1,
                                       max_model_len=max(1024, args.prompt_len + args.decode_steps + 8)).llm_kwargs())
    prompt = TokensPrompt(prompt_token_ids=[100 + (i * 7919) % 40000 for i in range(args.prompt_len)])

    import time

    # By module name, not __main__: the worker must keep the profiler in one module's globals.
    from harness.memory import profile as worker_side

    walls: dict[int, list[float]] = {}

    def profiled(n: int) -> dict[str, float]:
        sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        for _ in range(3):  # warm, unprofiled, timed: the best of three
            t = time.perf_counter()
            llm.generate([prompt], sp, use_tqdm=False)
            walls.setdefault(n, []).append(time.perf_counter() - t)
        llm.collective_rpc(worker_side.start)
        llm.generate([prompt], sp, use_tqdm=False)
        return llm.collective_rpc(worker_side.stop)[0]

    a = profiled(1)
    b = profiled(1 + args.decode_steps)
    # one decode step as vllm.LLM runs it without the profiler (engine core, scheduler, worker), microseconds
    step_wall_us = (min(walls[1 + args.decode_steps]) - min(walls[1])) / args.decode_steps * 1e6
    per_op = {k: (b.get(k, 0.0) - a.get(k, 0.0)) / args.decode_steps for k in set(a) | set(b)}
    per_op = {k: v for k, v in per_op.items() if v > 0.5}
    groups: dict[str, float] = {}
    for k, v in per_op.items():
        groups[classify(k)] = groups.get(classify(k), 0.0) + v
    total = sum(groups.values())
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:15]
    print(f"decode step at depth {args.prompt_len}: {total:.0f} us of op self time (profiled), "
          f"{step_wall_us:.0f} us of wall time (unprofiled)")
    for g, v in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {g:10s} {v:9.0f} us  {100 * v / total:5.1f}%")
    for k, v in top:
        print(f"    {k:50s} {v:9.1f} us  [{classify(k)}]")
    result = {"metrics": {"op_self_us": total, "step_wall_us": step_wall_us}, "groups_us": groups,
              "share": {g: v / total for g, v in groups.items()}, "top_ops_us": dict(top), "params": vars(args)}
    print(json.dumps(result), flush=True)
    if args.out:
        from datetime import UTC, datetime

        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {
            "kind": "decode_step_profile", "created": datetime.now(UTC).isoformat(timespec="seconds"),
            **result, "per_op_us": dict(sorted(per_op.items(), key=lambda kv: -kv[1])),
            "provenance": prov, "labels": labels})
        print(f"artifact: {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
