"""Arm runner: llama.cpp through ``llama-cpp-python`` on the GGUF, the CPU user's baseline.

    python harness/run_llamacpp.py --model smollm2-135m [--prompt-len 512] [--gen-len 128]
        [--context-len 16]

The same metrics as ``run_vllm.py`` where llama.cpp has them, measured the way
llama-bench does: ``pp_tps`` = ``prompt_len`` / seconds to evaluate the prompt in one
batch; ``tg_tps`` = ``gen_len`` / seconds to decode ``gen_len`` tokens one at a time
(greedy: argmax of the last logits) after a ``context_len``-token prompt;
``rss_anon_tree_mb`` = RssAnon of this process (llama.cpp mmaps the GGUF, whose file
pages are not anonymous). Thread count = the CPUs this process may use (the harness
pins it), for prompt and batch alike. ``llama-cpp-python`` is an optional extra
(``make bench-setup``; pip builds it from source in about 5 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main"]

MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="run_llamacpp.py", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a harness.models name or a .gguf file")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    args = ap.parse_args(argv)

    from harness.memory import tree_memory
    from harness.models import MODELS, gguf_path
    from harness.provenance import checkpoint_fingerprint

    try:
        from llama_cpp import Llama
    except ImportError:
        print("run_llamacpp: llama-cpp-python is not installed; run `make bench-setup`", file=sys.stderr)
        return 2
    import numpy as np

    path = str(gguf_path(args.model)) if args.model in MODELS else args.model
    threads = len(os.sched_getaffinity(0))
    n_ctx = max(args.prompt_len, args.context_len + args.gen_len) + 8
    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=max(args.prompt_len, 512), verbose=False)
    load_s = time.perf_counter() - t0

    def prompt(n: int, offset: int) -> list[int]:
        return [100 + ((i * 7919 + offset) % 40000) for i in range(n)]

    llm.reset()
    llm.eval(prompt(8, 99))  # warm-up, not measured
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt(args.prompt_len, 1))
    pp_s = time.perf_counter() - t

    llm.reset()
    llm.eval(prompt(args.context_len, 2))
    t = time.perf_counter()
    for _ in range(args.gen_len):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([nxt])
    tg_s = time.perf_counter() - t
    tree = tree_memory(os.getpid())
    size, sha = checkpoint_fingerprint(path)
    from importlib.metadata import version

    result = {
        "metrics": {
            "pp_tps": args.prompt_len / pp_s,
            "tg_tps": args.gen_len / tg_s,
            "rss_anon_tree_mb": sum(p.rss_anon for p in tree) / MiB,
        },
        "provenance": {
            "platform": f"llama.cpp via llama-cpp-python {version('llama-cpp-python')}",
            "worker_threads": threads,
            "worker_cpus": sorted(os.sched_getaffinity(0)),
            "model_path": path,
            "model_bytes": size,
            "model_sha256": sha,
            "quantization": "gguf (as stored in the file)",
            "head_dtype": "as stored in the GGUF",
            "patches": None,
            "load_s": load_s,
            "processes_ready": [p.to_dict() for p in tree],
            "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
