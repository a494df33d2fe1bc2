"""Arm runner: llama.cpp through ``llama-cpp-python`` on the GGUF, the CPU user's baseline.

    python harness/arms/llamacpp.py --model smollm2-135m [--prompt-len 512] [--gen-len 128]
        [--context-len 16]

The same metrics as ``harness.arms.vllm`` where llama.cpp has them, measured the way
llama-bench does: ``pp_tps`` = ``prompt_len`` / seconds to evaluate the prompt in one
batch; ``tg_tps`` = ``gen_len`` / seconds to decode ``gen_len`` tokens one at a time
(greedy: argmax of the last logits) after a ``context_len``-token prompt;
``rss_anon_tree_mb`` = RssAnon of this process (llama.cpp mmaps the GGUF, whose file
pages are not anonymous); ``start_cold_s`` / ``start_warm_s`` = launch to first token, as for
every arm (harness/arms/start.py). Thread count = the CPUs this process may use (the harness
pins it), for prompt and batch alike. ``llama-cpp-python`` is an optional extra
(``make bench-setup``; pip builds it from source in about 5 minutes).

Extra buffer types (``--extra-bufts``, llama.cpp's ``use_extra_bufts``: weight repacking
and, on CPUs with AMX-INT8, the AMX backend): the llama.cpp inside llama-cpp-python
0.3.36, built for the CPU it runs on, places Q4_1 weights in AMX buffers on an AMX CPU and
then crashes (SIGSEGV) on every multi-token batch (prompt eval); upstream fixed the AMX
batched path later (ggml-org/llama.cpp pull request 19925). ``auto`` (the default) turns
the extra buffer types off on an AMX-INT8 CPU, so that every metric runs, and on
elsewhere. ``--decode-only`` with ``--extra-bufts on`` measures llama.cpp's AMX decode
alone: the context is fed one token at a time and ``pp_tps`` is not reported. The
choice and its reason are in the provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["main"]

MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-llamacpp", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a harness.models.registry name or a .gguf file")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    ap.add_argument("--extra-bufts", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's extra buffer types (repacking, AMX); auto: off on an AMX-INT8 CPU")
    ap.add_argument("--decode-only", action="store_true",
                    help="no multi-token batch: feed the context token by token, report no pp_tps")
    args = ap.parse_args(argv)

    from harness.arms import start
    from harness.memory.peak import TreePeak
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.models.registry import MODELS, gguf_path
    from harness.provenance import checkpoint_fingerprint

    try:
        from llama_cpp import Llama
    except ImportError:
        print("run_llamacpp: llama-cpp-python is not installed; run `make bench-setup`", file=sys.stderr)
        return 2
    import llama_cpp.llama as llama_module
    import numpy as np

    cache = os.environ.get("VLLM_CACHE_ROOT")
    cold = start.cache_is_empty(cache)
    path = str(gguf_path(args.model)) if args.model in MODELS else args.model
    threads = len(os.sched_getaffinity(0))
    n_ctx = max(args.prompt_len, args.context_len + args.gen_len) + 8
    extra, extra_reason = _extra_bufts(args.extra_bufts)
    default_params = llama_module.llama_cpp.llama_model_default_params

    def model_params():
        params = default_params()
        params.use_extra_bufts = extra
        return params

    llama_module.llama_cpp.llama_model_default_params = model_params  # read once by Llama() below
    peak = TreePeak(os.getpid()).start()
    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                n_batch=max(args.prompt_len, 512), verbose=False)
    load_s = time.perf_counter() - t0
    llama_module.llama_cpp.llama_model_default_params = default_params

    def prompt(n: int, offset: int) -> list[int]:
        return [100 + ((i * 7919 + offset) % 40000) for i in range(n)]

    def feed(tokens: list[int]) -> None:
        if args.decode_only:
            for tok in tokens:
                llm.eval([tok])
        else:
            llm.eval(tokens)

    llm.reset()
    feed(prompt(8, 99))  # warm-up, not measured, but its first token ends the start
    int(np.argmax(llm.scores[llm.n_tokens - 1]))
    start_s = start.seconds_since_launch()
    peak.stop()
    start.mark_started(cache, "llamacpp")
    pp_s = None
    if not args.decode_only:
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt(args.prompt_len, 1))
        pp_s = time.perf_counter() - t

    llm.reset()
    feed(prompt(args.context_len, 2))
    t = time.perf_counter()
    for _ in range(args.gen_len):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([nxt])
    tg_s = time.perf_counter() - t
    tree = tree_memory(os.getpid(), pss=True)
    size, sha = checkpoint_fingerprint(path)
    from importlib.metadata import version

    result = {
        "metrics": {
            **({} if pp_s is None else {"pp_tps": args.prompt_len / pp_s}),
            "tg_tps": args.gen_len / tg_s,
            **tree_metrics(tree),  # rss_anon_tree_mb, rss_file_tree_mb, rss_total_tree_mb
            **peak.metrics(),  # peak_anon_tree_mb, peak_total_tree_mb: model load to first token
            start.metric_name(cold): start_s,
        },
        "provenance": {
            "start_peak": peak.hwm(),
            "measured_differently": {
                "rss_anon_tree_mb": "RssAnon of one process; llama.cpp mmaps the GGUF, so its weights are file "
                                    "pages, in rss_file_tree_mb (compare rss_total_tree_mb and pss_tree_mb)",
                "pp_tps": "one llama_eval of the prompt batch (llama-bench's pp), not a request through a scheduler",
                start.metric_name(cold): "launch to first token like every arm; llama.cpp keeps no cache, so cold "
                                         "is its first start in the run (harness/arms/start.py)",
            },
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
            "use_extra_bufts": extra,
            "use_extra_bufts_reason": extra_reason,
            "processes_ready": [p.to_dict() for p in tree],
            "params": vars(args),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


def _extra_bufts(choice: str) -> tuple[bool, str]:
    """``(use_extra_bufts, why)`` for ``--extra-bufts`` on this CPU (``/proc/cpuinfo`` flags)."""
    if choice != "auto":
        return choice == "on", f"--extra-bufts {choice}"
    try:
        with open("/proc/cpuinfo") as f:
            amx = any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        amx = False
    if amx:
        return False, ("auto: off, the CPU has amx_int8 and llama-cpp-python 0.3.36's AMX buffers crash "
                       "on multi-token batches")
    return True, "auto: on (no amx_int8)"


if __name__ == "__main__":
    sys.exit(main())
