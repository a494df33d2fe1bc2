"""Arm runner: vLLM (stock or with omni, per ``VLLM_PLUGINS``) in the manner of llama-bench.

    python -m harness run-vllm --model smollm2-135m [--prompt-len 512] [--gen-len 128]
        [--context-len 16] [--concurrency 8] [--max-num-seqs 8] [--enforce-eager]
        [--kv-cache-memory-bytes N] [--quantization Q] [--max-num-batched-tokens N] [--server]

Prints one JSON object on its last stdout line: ``metrics`` and ``provenance``.

Metrics (units in harness/grid/metrics.py):
- ``pp_tps``: ``prompt_len`` / seconds of a request that prefills ``prompt_len`` tokens
  and generates one (pp512 with the default).
- ``tg_tps``: ``gen_len - 1`` / (T(gen_len) - T(1)) for one stream after a
  ``context_len``-token prompt, greedy, ignore_eos: the decode rate with the prefill
  and first token subtracted (tg128 with the default). The two requests have different contexts of
  the same length, so neither reuses the other's prefix cache.
- ``tg_gemv_ms`` and ``tg_host_ms`` (omni-quant's W4A8 layers only): of tg's T(gen_len) - T(1), the wall
  time inside the W4A8 GEMVs (``omni_quant.kernels.w4a8.linear_clock`` in the worker) and the rest, each per
  decode token, ms. The GEMVs follow the host's memory bandwidth; the rest (vLLM's Python, the compiled
  graph's small kernels, attention, sampling) does not, so it separates host-work changes that
  ``tg_tps`` cannot on a host whose bandwidth swings between passes.
- ``agg_tg_tps``: ``concurrency`` x ``gen_len`` / seconds, ``concurrency`` streams at once.
- ``start_cold_s`` or ``start_warm_s``: seconds from this process's launch to the first
  token of the first (one-token) request; cold when ``VLLM_CACHE_ROOT`` held no compile
  cache before, warm otherwise.
- ``rss_anon_tree_mb``: RssAnon summed over this process and its descendants at ready
  (engine core and workers included), MiB; ``rss_anon_tree_full_mb`` after a request
  that fills ``max_model_len`` tokens of KV cache (not with ``--no-full-request``: that
  request is two pp512s more, about 5 minutes for stock bf16 on one AVX2 core).
- ``peak_anon_tree_mb`` and ``peak_total_tree_mb``: the largest sampled sum over the tree of RssAnon,
  and of RssAnon + RssFile + RssShmem, from launch to the first token (``harness/memory/peak.py``).
- ``rss_anon_worker_mb``: RssAnon of the first worker alone, MiB, read inside it after the
  requests above; ``kv_cache_mb``: bytes of the KV cache tensors allocated in that worker,
  MiB (the budget vLLM actually honoured).

Provenance includes ``anon_huge_bytes`` and ``file_pmd_mapped_bytes``: each process's ``AnonHugePages``
and ``FilePmdMapped`` at the end, bytes (None where ``/proc/PID/smaps_rollup`` is unreadable), to check a
slow decode pass against how many of the weights sat on 2 MiB pages (anonymous copies, or the mapped
layout file).

With ``--server`` the same metrics (except the ``_full`` and worker ones) come from the
client side of ``omni-vllm serve`` (``harness/arms/server.py``), streamed.

Token prompts are made of fixed ids, so every arm sees the same input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["linear_clock", "main"]

MiB = 1 << 20


def _prompt(n: int, offset: int = 0) -> list[int]:
    # Ordinary token ids of SmolLM2's vocabulary (49152), avoiding special tokens < 20.
    return [100 + ((i * 7919 + offset) % 40000) for i in range(n)]


def _checkpoint_quant_method(model: str) -> str | None:
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return (cfg.get("quantization_config") or {}).get("quant_method")


def linear_clock(worker: Any = None) -> tuple[int, int]:
    """Inside a worker (through ``collective_rpc``): omni-quant's W4A8 linear clock, ``(ns, calls)``
    (``omni_quant.kernels.w4a8.linear_clock``); ``(0, 0)`` where omni-quant is not installed."""
    try:
        from omni_quant.kernels import w4a8 as native
    except ImportError:
        return (0, 0)
    return native.linear_clock()


def _decode_split(decode_s: float, c0: tuple[int, int], c1: tuple[int, int], c2: tuple[int, int],
                  tokens: int) -> dict[str, float]:
    """``tg_gemv_ms`` and ``tg_host_ms`` from three clock readings: before T(1), between, after T(gen_len).

    The GEMV nanoseconds of the one-token request (c1 - c0) are taken from those of the long one
    (c2 - c1), as ``decode_s`` is T(gen_len) - T(1). Empty when no W4A8 layer ran (stock vLLM, bf16).
    """
    ns = (c2[0] - c1[0]) - (c1[0] - c0[0])
    if (c2[1] - c1[1]) - (c1[1] - c0[1]) <= 0 or tokens <= 0:
        return {}
    gemv_s = ns / 1e9
    return {"tg_gemv_ms": gemv_s / tokens * 1e3, "tg_host_ms": (decode_s - gemv_s) / tokens * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-vllm", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a harness.models.registry name or a checkpoint directory")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="vLLM's token budget per step; also the size of the compiled-mode warm-up run")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--inductor-cpp-wrapper", action="store_true",
                    help="compiled mode: inductor's C++ wrapper "
                         "(compilation_config.inductor_compile_config.cpp_wrapper)")
    ap.add_argument("--no-full-request", action="store_true",
                    help="skip the max_model_len request (no rss_anon_tree_full_mb)")
    ap.add_argument("--server", action="store_true",
                    help="measure `omni-vllm serve` from an HTTP client instead of vllm.LLM in this process")
    ap.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /health")
    ap.add_argument("--first-start", action="store_true",
                    help="--server: every pass a first start: a new empty VLLM_CACHE_ROOT under the arm's, and the "
                         "background compile (omni_platform.compile_ahead) killed with its process group after "
                         "the pass instead of waited for; the directory is removed")
    args = ap.parse_args(argv)
    if args.server:
        return _main_server(args)

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a function
    from harness.memory.peak import TreePeak
    from harness.memory.tree import tree_memory, tree_metrics

    peak = TreePeak(os.getpid()).start()
    from harness.models.registry import MODELS, fetch
    from harness.provenance import checkpoint_fingerprint

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    from harness.arms import start

    cold = start.cache_is_empty(os.environ.get("VLLM_CACHE_ROOT"))

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.models.recipe import EngineRecipe

    kwargs = EngineRecipe.from_args(model, args).llm_kwargs()
    llm = LLM(**kwargs)
    llm.generate([TokensPrompt(prompt_token_ids=_prompt(8, 98))],
                 SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    start_s = start.seconds_since_launch()
    tree_ready = tree_memory(os.getpid(), pss=True)
    peak.stop()

    def timed(prompts, max_tokens):
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
        return dt

    timed([_prompt(8, 99)], 4)  # warm-up request, not measured
    pp_s = timed([_prompt(args.prompt_len, 1)], 1)
    # two different contexts of the same length: with the same one, the second request would find the first's
    # full KV blocks in vLLM's prefix cache, skip their prefill and make T(gen_len) - T(1) meaningless
    # (negative from a 1024-token context on); shorter than one block (128) nothing is cached either way
    clock0 = llm.collective_rpc(linear_clock)[0]
    t_one = timed([_prompt(args.context_len, 2)], 1)
    clock1 = llm.collective_rpc(linear_clock)[0]
    t_gen = timed([_prompt(args.context_len, 5)], args.gen_len)
    clock2 = llm.collective_rpc(linear_clock)[0]
    agg_s = timed([_prompt(args.context_len, 10 + i) for i in range(args.concurrency)], args.gen_len)
    if not args.no_full_request:
        timed([_prompt(args.max_model_len - 1, 3)], 1)
    tree_full = tree_memory(os.getpid())
    from harness.memory.tree import anon_huge_bytes, file_pmd_mapped_bytes

    # AnonHugePages per process after the requests: decode reads every weight a token, through the TLB
    # (docs/cpu_int4.md, Huge pages), so a slow pass can be checked against its weights' pages
    huge = {p.pid: anon_huge_bytes(Path(f"/proc/{p.pid}/smaps_rollup")) for p in tree_ready}
    file_pmd = {p.pid: file_pmd_mapped_bytes(Path(f"/proc/{p.pid}/smaps_rollup")) for p in tree_ready}

    from omni_platform.probe import worker_report

    workers = llm.collective_rpc(worker_report)
    w0 = workers[0]
    quant = w0["extension_reports"].get("quant", {})
    size, sha = checkpoint_fingerprint(model)
    metrics = {
        "pp_tps": args.prompt_len / pp_s,
        "tg_tps": (args.gen_len - 1) / (t_gen - t_one),
        "agg_tg_tps": args.concurrency * args.gen_len / agg_s,
        start.metric_name(cold): start_s,
        **tree_metrics(tree_ready),  # rss_anon_tree_mb, rss_file_tree_mb, rss_total_tree_mb
        **peak.metrics(),  # peak_anon_tree_mb, peak_total_tree_mb: launch to first token
        "rss_anon_worker_mb": w0["rss_anon"] / MiB,
    }
    metrics.update(_decode_split(t_gen - t_one, clock0, clock1, clock2, args.gen_len - 1))
    if not args.no_full_request:
        metrics["rss_anon_tree_full_mb"] = sum(p.rss_anon for p in tree_full) / MiB
    if w0["kv_cache"]:
        metrics["kv_cache_mb"] = w0["kv_cache"]["bytes"] / MiB
    result = {
        "metrics": metrics,
        "provenance": {
            "platform": w0["platform"],
            "worker_threads": w0["torch_threads"],
            "worker_cpus": w0["threads_cpus"],
            "omp_env": w0["omp_env"],
            "model_path": model,
            "model_bytes": size,
            "model_sha256": sha,
            "quantization": args.quantization or _checkpoint_quant_method(model),
            # cpu_int4 replaces the head's weight by 4-bit codes: omni-quant's report names its kernel
            "head_dtype": w0.get("head_dtype") or ("int4" if quant.get("head") else None),
            "head_kernel": quant.get("head"),
            "head_quant_method": w0.get("head_quant_method"),
            "head_tied": w0.get("head_tied"),
            "patches": w0["extension_reports"].get("patches", {}).get("applied"),
            "extension_reports": w0["extension_reports"],
            "kv_cache": w0["kv_cache"],
            "enforce_eager": args.enforce_eager,
            "compile_cache": "cold" if cold else "warm",
            "processes_ready": [p.to_dict() for p in tree_ready],
            "processes_full": [p.to_dict() for p in tree_full],
            "anon_huge_bytes": huge,
            "file_pmd_mapped_bytes": file_pmd,
            "start_peak": peak.hwm(),
            "params": vars(args),
        },
    }
    # vLLM logs its shutdown to stdout at exit: stop the engine first, then print the
    # result as the last line, then leave without running exit handlers that would log.
    llm.llm_engine.engine_core.shutdown()
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)


def _main_server(args: argparse.Namespace) -> int:
    """``--server``: measure ``omni-vllm serve`` from the client; print the same JSON shape."""
    from harness.arms.server import measure_server
    from harness.models.registry import MODELS, REPO_ROOT, fetch
    from harness.provenance import checkpoint_fingerprint

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    from harness.arms import start

    if args.first_start:
        import shutil
        import tempfile

        base = os.environ.get("VLLM_CACHE_ROOT") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="first-start-", dir=base)
    cold = start.cache_is_empty(os.environ.get("VLLM_CACHE_ROOT"))
    log = REPO_ROOT / ".cache" / f"run_vllm-server-{os.getpid()}.log"
    try:
        metrics, server = measure_server(model, args, _prompt, cold, log)
    finally:
        if args.first_start:
            shutil.rmtree(os.environ["VLLM_CACHE_ROOT"], ignore_errors=True)
    size, sha = checkpoint_fingerprint(model)
    result = {
        "metrics": metrics,
        "provenance": {
            **server,
            "model_path": model,
            "model_bytes": size,
            "model_sha256": sha,
            "quantization": args.quantization or _checkpoint_quant_method(model),
            "enforce_eager": args.enforce_eager,
            "compile_cache": "cold" if cold else "warm",
            "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
