"""Arm runner: OpenVINO GenAI's continuous-batching pipeline under 1-16 concurrent streams, in process.

    .venv-ov/bin/python -m harness run-load-openvino --model qwen2.5-coder-1.5b [--streams 1,2,4,8,16]

OpenVINO GenAI ships no OpenAI server in its wheels (its server is OpenVINO Model Server, a separate
binary), so this arm does what ``python -m harness run-load`` does for a server, inside one process: the same
chat requests (``harness.load.sweep.requests_for``: the workload prompts in turn, greedy, EOS ignored,
``--max-tokens`` each), the same closed loop (N clients, each submitting its next request when its last one
ends), the same figures (``harness.load.client.summarize``). The requests go to
``openvino_genai.ContinuousBatchingPipeline`` (``add_request`` / ``step``), the scheduler OpenVINO's own
server runs, on the IR of ``make ov-model``.

Measured differently from the HTTP servers, and labelled so in the artifact: no HTTP, no JSON, no
detokenization per chunk; a token's time is when the pipeline ``step`` that produced it returns (a chunk is
what one step gave a request). The prompts are rendered with the model's chat template by OpenVINO's
tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["drive_closed_loop", "main"]


def drive_closed_loop(submit: Callable[[int, dict], Any], step: Callable[[], None],
                      poll: Callable[[Any], tuple[int, bool]], requests: list[dict], streams: int,
                      clock: Callable[[], float] = time.perf_counter) -> tuple[list, float]:
    """Run ``requests`` through a stepped engine from ``streams`` concurrent clients (a closed loop).

    ``submit(i, request)`` starts request ``i`` and returns its handle; ``step()`` advances the engine one
    iteration; ``poll(handle)`` returns (tokens produced since the last poll, finished). A request whose poll
    gives tokens gets one chunk time (the clock after that step). Returns the
    ``harness.load.client.RequestResult`` list in request order (``status`` 200, or None with ``error`` when
    ``submit`` or ``poll`` raised) and the wall seconds.

    Raises:
        ValueError: ``streams`` < 1.
    """
    from harness.load.client import RequestResult

    if streams < 1:
        raise ValueError(f"streams must be at least 1, got {streams}")
    results: list[RequestResult] = []
    active: dict[int, Any] = {}
    nxt = 0
    t0 = clock()

    def start_next() -> None:
        nonlocal nxt
        r = requests[nxt]
        res = RequestResult(index=nxt, stream=True, max_tokens=int(r["body"].get("max_tokens") or 0), sent=clock())
        results.append(res)
        try:
            active[nxt] = submit(nxt, r)
            res.status = 200
        except Exception as e:  # noqa: BLE001 - recorded as this request's error, the loop goes on
            res.error, res.done = f"{type(e).__name__}: {str(e)[:300]}", clock()
        nxt += 1

    while nxt < len(requests) or active:
        while len(active) < streams and nxt < len(requests):
            start_next()
        if not active:
            continue
        step()
        now = clock()
        for i in list(active):
            res = results[i]
            try:
                new, finished = poll(active[i])
            except Exception as e:  # noqa: BLE001
                res.error, finished, new = f"{type(e).__name__}: {str(e)[:300]}", True, 0
            if new:
                res.first = res.first or now
                res.chunk_times.append(now)
                res.completion_tokens += new
            if finished:
                res.done = now
                del active[i]
    return results, clock() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-load-openvino", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a model name (IR: make ov-model)")
    ap.add_argument("--streams", default="1,2,4,8,16", help="comma-separated stream counts")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--workloads", default="edit,qa,prose")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0,
                    help="SchedulerConfig.cache_size, GB of KV cache (OpenVINO's own unit)")
    args = ap.parse_args(argv)
    from harness.arms.openvino import require_ir

    path = require_ir(args.model, "run-load-openvino")
    if path is None:
        return 2
    import openvino_genai as ov_genai

    from harness.load.client import summarize
    from harness.load.sweep import requests_for
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.provenance import checkpoint_fingerprint

    streams = [int(s) for s in args.streams.split(",") if s]
    if not streams or min(streams) < 1:
        ap.error("--streams needs stream counts of at least 1")
    threads = len(os.sched_getaffinity(0))
    sched = ov_genai.SchedulerConfig()
    sched.cache_size = int(args.kv_cache_gb) if args.kv_cache_gb.is_integer() else args.kv_cache_gb
    t0 = time.perf_counter()
    pipe = ov_genai.ContinuousBatchingPipeline(str(path), sched, "CPU", {"INFERENCE_NUM_THREADS": threads})
    load_s = time.perf_counter() - t0
    tokenizer = pipe.get_tokenizer()
    workloads = tuple(w for w in args.workloads.split(",") if w)

    def submit(i: int, r: dict):
        body = r["body"]
        prompt = tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True)
        cfg = ov_genai.GenerationConfig()
        cfg.max_new_tokens = cfg.min_new_tokens = int(body["max_tokens"])
        cfg.ignore_eos = bool(body.get("ignore_eos"))
        cfg.do_sample = False
        return pipe.add_request(i, prompt, cfg)

    def poll(handle) -> tuple[int, bool]:
        new = 0
        if handle.can_read():
            new = sum(len(out.generated_ids) for out in handle.read().values())
        status = handle.get_status()
        if status == ov_genai.GenerationStatus.RUNNING:
            return new, False
        if status != ov_genai.GenerationStatus.FINISHED:
            raise RuntimeError(f"request ended with status {status}")
        return new, True

    metrics: dict[str, float] = {}
    points: list[dict] = []
    drive_closed_loop(submit, pipe.step, poll, requests_for(1, 1, 8, workloads), 1)  # warm-up
    for n in streams:
        results, wall = drive_closed_loop(submit, pipe.step, poll,
                                          requests_for(n, args.requests_per_stream, args.max_tokens, workloads), n)
        s = summarize(results, wall)
        metrics[f"errors_c{n}"] = s["requests"] - s["ok"]
        for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
            if s[key] is not None:
                metrics[f"{key}_c{n}"] = s[key]
        if s["completion_tokens"]:
            metrics[f"load_tps_c{n}"] = s["agg_tps"]
        tree = tree_metrics(tree_memory(os.getpid()))
        points.append({"streams": n, "summary": s, "rss_anon_tree_mb": tree["rss_anon_tree_mb"],
                       "requests": [r.to_dict() for r in results]})
        print(f"run-load-openvino: {n} streams: {s['agg_tps'] or 0:.1f} tok/s, "
              f"TTFT p99 {s['ttft_p99_ms'] or 0:.0f} ms, errors {s['requests'] - s['ok']}", file=sys.stderr, flush=True)
    from importlib.metadata import version

    from harness.workloads.prompts import all_prompts

    size, sha = checkpoint_fingerprint(path)
    print(json.dumps({"metrics": metrics, "provenance": {
        "platform": f"OpenVINO GenAI {version('openvino-genai')} ContinuousBatchingPipeline, in process",
        "measured_differently": {k: "in process, no HTTP: a token's time is the end of the pipeline step that "
                                    "produced it (harness/load/openvino_cb.py)"
                                 for k in metrics if not k.startswith("errors")},
        "worker_threads": threads, "worker_cpus": sorted(os.sched_getaffinity(0)), "model_path": str(path),
        "model_bytes": size, "model_sha256": sha,
        "quantization": "int4 weights (NNCF, optimum-cli export openvino --weight-format int4)",
        "head_dtype": "int8 per channel (NNCF's default for the output head)", "patches": None,
        "scheduler_config": {k: getattr(sched, k) for k in dir(sched)
                             if not k.startswith("_") and isinstance(getattr(sched, k), (int, float, bool))},
        "load_s": load_s, "prompts": [p.to_dict() for p in all_prompts(workloads)], "points": points,
        "params": vars(args)}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
