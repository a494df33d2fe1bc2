"""Arm runner: a server held under concurrent clients for a set time, watched for errors, memory creep and drift.

    python -m harness run-soak --server omni --model smollm2-135m-int4 [--clients 16] [--seconds 600]

``--clients`` closed-loop clients send chat requests until ``--seconds`` have passed: a random workload prompt
(``harness.workloads.prompts``) cut to a random 10-100% of its text, a random ``max_tokens`` in
``[8, --max-tokens]`` with ``ignore_eos``, greedy or sampled (temperature 0.8, a seed) at random, streamed or
not at random, and ``--cancel-frac`` of them streamed and closed by the client after a random number of
chunks. All random choices come from ``--seed``. Loopback only; the client count and the time are bounded
(``MAX_CLIENTS``, ``MAX_SECONDS``).

Before the first and after the last request one known greedy request (not streamed) is sent alone; its
text must be the same (``soak_same_text`` 1, else 0).

Recorded: every ``--sample-s`` seconds the server tree's RssAnon (``harness.memory.tree``) with the count of
requests finished; the slope of RssAnon against requests after ``--warmup-s`` (least squares,
``soak_rss_slope_kib_per_req``, KiB per request: a leak shows as a steady positive slope); per window of
``--window-s`` seconds the requests, errors and TTFT p50/p99. Metrics: ``soak_5xx``, ``soak_4xx``,
``soak_errors_other`` (no HTTP answer, a broken stream), ``soak_requests``, ``soak_ttft_p99_ms``,
``soak_rss_slope_kib_per_req``, ``soak_same_text``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import numpy as np

__all__ = ["main", "random_request", "rss_slope_kib_per_request", "windows", "MAX_CLIENTS", "MAX_SECONDS"]

MAX_CLIENTS = 64
MAX_SECONDS = 3600.0
KNOWN = {"model": "m", "messages": [{"role": "user", "content": "List the first five prime numbers."}],
         "max_tokens": 32, "temperature": 0.0}


def random_request(rng: random.Random, prompts: list, max_tokens: int, cancel_frac: float) -> dict:
    """One request dict for :func:`harness.load.client.chat_once` (``body``, ``stream``, ``cancel_after``),
    drawn from ``rng`` as the module docstring says."""
    p = rng.choice(prompts)
    text = p.messages[-1]["content"]
    text = text[: max(16, int(len(text) * rng.uniform(0.1, 1.0)))]
    n = rng.randint(8, max_tokens)
    body = {"model": "m", "messages": [*p.messages[:-1], {"role": "user", "content": text}], "max_tokens": n,
            "ignore_eos": True, "temperature": 0.0}
    if rng.random() < 0.5:
        body.update(temperature=0.8, seed=rng.randint(0, 2**31 - 1))
    if rng.random() < cancel_frac:
        return {"body": body, "stream": True, "cancel_after": rng.randint(1, max(1, n // 2))}
    return {"body": body, "stream": rng.random() < 0.5, "cancel_after": None}


def rss_slope_kib_per_request(samples: list[dict], warmup_s: float) -> float | None:
    """Least-squares slope of ``rss_anon_bytes`` against ``requests_done`` over the samples taken at or after
    ``warmup_s`` seconds, in KiB per request; None with fewer than 3 such samples or no requests between."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    x = np.asarray([s["requests_done"] for s in after], dtype=np.float64)
    if len(after) < 3 or x.max() == x.min():
        return None
    y = np.asarray([s["rss_anon_bytes"] for s in after], dtype=np.float64)
    return float(np.polyfit(x, y, 1)[0] / 1024)


def windows(results: list, t0: float, window_s: float) -> list[dict]:
    """Per window of ``window_s`` seconds (by send time from ``t0``): requests, ok, errors, TTFT p50/p99 (ms)."""
    from harness.load.client import percentile_ms

    out: dict[int, list] = {}
    for r in results:
        out.setdefault(int((r.sent - t0) // window_s), []).append(r)
    rows = []
    for k in sorted(out):
        rs = out[k]
        ttft = [r.ttft_s for r in rs if r.ok and r.stream and r.ttft_s is not None]
        rows.append({"window": k, "start_s": k * window_s, "requests": len(rs), "ok": sum(r.ok for r in rs),
                     "errors": sum(not r.ok for r in rs), "ttft_p50_ms": percentile_ms(ttft, 50),
                     "ttft_p99_ms": percentile_ms(ttft, 99)})
    return rows


async def _soak(base: str, pid: int, args: argparse.Namespace, prompts: list) -> dict:
    import aiohttp

    from harness.load.client import chat_once, new_connector, summarize
    from harness.memory.tree import tree_memory

    rng = random.Random(args.seed)
    results: list = []
    samples: list[dict] = []
    done = 0

    def rss() -> int:
        return sum(p.rss_anon for p in tree_memory(pid))

    async with aiohttp.ClientSession(connector=new_connector(args.clients + 2)) as session:
        first = await chat_once(session, base, KNOWN, stream=False)
        t0 = time.perf_counter()
        deadline = t0 + args.seconds
        samples.append({"t_s": 0.0, "requests_done": 0, "rss_anon_bytes": rss()})

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                r = random_request(rng, prompts, args.max_tokens, args.cancel_frac)
                res = await chat_once(session, base, r["body"], index=len(results), stream=r["stream"],
                                      cancel_after=r["cancel_after"], timeout_s=args.request_timeout)
                results.append(res)
                done += 1

        async def sampler() -> None:
            loop = asyncio.get_running_loop()
            while time.perf_counter() < deadline:
                await asyncio.sleep(min(args.sample_s, max(0.0, deadline - time.perf_counter())))
                value = await loop.run_in_executor(None, rss)
                samples.append({"t_s": time.perf_counter() - t0, "requests_done": done, "rss_anon_bytes": value})

        await asyncio.gather(sampler(), *(client() for _ in range(args.clients)))
        wall = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # cancelled streams' aborts reach the engine
        samples.append({"t_s": time.perf_counter() - t0, "requests_done": done, "rss_anon_bytes": rss()})
        last = await chat_once(session, base, KNOWN, stream=False)
    summary = summarize(results, wall)
    return {"known_first": first, "known_last": last, "results": results, "samples": samples, "summary": summary,
            "windows": windows(results, t0, args.window_s),
            "slope": rss_slope_kib_per_request(samples, args.warmup_s)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-soak", description=__doc__.split("\n")[0])
    ap.add_argument("--server", choices=("omni", "llama-server"), required=True)
    ap.add_argument("--model", required=True, help="registry name (harness.models) or a checkpoint dir / .gguf")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--sample-s", type=float, default=30.0, help="seconds between RssAnon samples")
    ap.add_argument("--warmup-s", type=float, default=60.0, help="seconds before the RssAnon slope counts")
    ap.add_argument("--window-s", type=float, default=60.0, help="seconds per latency window")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--cancel-frac", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--extra", default="", help="further server arguments (one shell-quoted string)")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="llama-server: context tokens per slot")
    ap.add_argument("--binary", default=None)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for /health")
    args = ap.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS:
        ap.error(f"--clients must be 1..{MAX_CLIENTS}, got {args.clients}")
    if not 0 < args.seconds <= MAX_SECONDS:
        ap.error(f"--seconds must be in (0, {MAX_SECONDS:.0f}], got {args.seconds}")
    if not 0 <= args.cancel_frac <= 1:
        ap.error(f"--cancel-frac must be in [0, 1], got {args.cancel_frac}")

    from harness.load.servers import ServerSpec, start_server
    from harness.load.sweep import _model_path, client_provenance
    from harness.workloads.prompts import all_prompts

    prompts = all_prompts()
    spec = ServerSpec(args.server, _model_path(args.server, args.model), args.extra, args.ctx_per_slot, args.binary)
    server = start_server(spec, slots=args.clients, timeout_s=args.timeout)
    try:
        out = asyncio.run(_soak(server.base, server.proc.pid, args, prompts))
    finally:
        server.stop()
    s, first, last = out["summary"], out["known_first"], out["known_last"]
    same = first.ok and last.ok and first.text == last.text
    metrics = {"soak_5xx": s["errors_5xx"], "soak_4xx": s["errors_4xx"], "soak_errors_other": s["errors_other"],
               "soak_requests": s["requests"], "soak_same_text": int(same)}
    if s["ttft_p99_ms"] is not None:
        metrics["soak_ttft_p99_ms"] = s["ttft_p99_ms"]
    if out["slope"] is not None:
        metrics["soak_rss_slope_kib_per_req"] = out["slope"]
    failures = [r.to_dict() for r in out["results"] if not r.ok][:20]
    result = {
        "metrics": metrics,
        "provenance": {
            **client_provenance(args.server, spec), "server_command": server.command, "summary": s,
            "known_text": {"first": first.text, "last": last.text, "first_error": first.error,
                           "last_error": last.error},
            "rss_samples": out["samples"], "windows": out["windows"], "failures": failures,
            "prompts": [p.to_dict() for p in prompts], "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
