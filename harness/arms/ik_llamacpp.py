"""Arm runner: ik_llama.cpp (the llama.cpp fork with its own CPU kernels) on the GGUF, through ``ik-llama-cpp-python``.

    python -m harness run-ik-llamacpp --model qwen2.5-coder-1.5b [--repack on|off] [--prompt-len 512]
        [--gen-len 128] [--context-len 16]

Measured as ``harness.arms.llamacpp`` measures llama.cpp (llama-bench's way): ``pp_tps`` = ``prompt_len`` /
seconds of one ``llama_decode`` of the prompt batch; ``tg_tps`` = ``gen_len`` / seconds to decode that many tokens
one at a time after a ``context_len``-token prompt, each the argmax of the last logits (read with numpy; the
package's own ``IkContext.sample`` builds a Python list over the whole vocabulary per token, which would
measure Python); memory and start-up as every arm. Threads: the CPUs this process may use.

``--repack on`` sets ik_llama.cpp's ``repack_tensors`` (its ``-rtr``: weights rewritten at load into its
row-interleaved layouts, the mode its authors measure); ``off`` runs the file's quant types as stored. Flash
attention is on where the package enables it (it turns it off on CPUs without AVX-VNNI, where ik_llama.cpp's
CPU flash attention asserts).

``ik-llama-cpp-python`` 0.1.5 (a prebuilt x86-64 wheel) lives in its own folder, ``.cache/peers/
ik-llama-cpp-python-0.1.5`` (``make bench-ik-setup``), which only this arm's process puts on ``sys.path``:
its package is ``ik_llama_cpp``, and its wheel also carries top-level ``lib``, ``bin`` and ``include`` folders
that do not belong in the project's environment.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["IK_DIR", "main"]

IK_VERSION = "0.1.5"
IK_DIR = Path(__file__).resolve().parents[2] / ".cache" / "peers" / f"ik-llama-cpp-python-{IK_VERSION}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-ik-llamacpp", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a harness.models.registry name or a .gguf file")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    ap.add_argument("--repack", choices=("on", "off"), default="on",
                    help="ik_llama.cpp's run-time repacking (repack_tensors, its -rtr)")
    args = ap.parse_args(argv)

    from harness.arms import start
    from harness.memory.peak import TreePeak
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.models.registry import MODELS, gguf_path
    from harness.provenance import checkpoint_fingerprint

    if not (IK_DIR / "ik_llama_cpp").is_dir():
        print(f"run-ik-llamacpp: ik-llama-cpp-python is not installed in {IK_DIR}; run `make bench-ik-setup`",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(IK_DIR))
    import numpy as np
    from ik_llama_cpp import _ctypes_api as C
    from ik_llama_cpp._internals import make_batch_range, make_batch_single

    cache = os.environ.get("VLLM_CACHE_ROOT")
    cold = start.cache_is_empty(cache)
    path = str(gguf_path(args.model)) if args.model in MODELS else args.model
    threads = len(os.sched_getaffinity(0))
    n_ctx = max(args.prompt_len, args.context_len + args.gen_len) + 8
    vnni = _has_avx_vnni()

    peak = TreePeak(os.getpid()).start()
    t0 = time.perf_counter()
    C.llama_backend_init()
    mparams = C.llama_model_default_params()
    mparams.repack_tensors = args.repack == "on"
    model = C.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        print(f"run-ik-llamacpp: ik_llama.cpp could not load {path}", file=sys.stderr)
        return 1
    cparams = C.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = max(args.prompt_len, 512)
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.flash_attn = vnni
    ctx = C.llama_init_from_model(model, cparams)
    if not ctx:
        print(f"run-ik-llamacpp: ik_llama.cpp could not create a context for {path}", file=sys.stderr)
        return 1
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(model))
    load_s = time.perf_counter() - t0

    def decode(batch) -> None:
        ret = C.llama_decode(ctx, batch)
        C.llama_batch_free(batch)
        if ret != 0:
            raise RuntimeError(f"llama_decode returned {ret}")

    def argmax() -> int:
        logits = C.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)), (n_vocab,)).argmax())

    def prompt(n: int, offset: int) -> list[int]:
        return [100 + ((i * 7919 + offset) % min(40000, n_vocab - 200)) for i in range(n)]

    C.llama_kv_cache_clear(ctx)
    decode(make_batch_range(prompt(8, 99)))  # warm-up, not measured; its first token ends the start
    argmax()
    start_s = start.seconds_since_launch()
    peak.stop()
    start.mark_started(cache, "ik-llamacpp")

    C.llama_kv_cache_clear(ctx)
    t = time.perf_counter()
    decode(make_batch_range(prompt(args.prompt_len, 1)))
    pp_s = time.perf_counter() - t

    C.llama_kv_cache_clear(ctx)
    decode(make_batch_range(prompt(args.context_len, 2)))
    pos = args.context_len
    t = time.perf_counter()
    for _ in range(args.gen_len):
        decode(make_batch_single(argmax(), pos))
        pos += 1
    tg_s = time.perf_counter() - t
    tree = tree_memory(os.getpid(), pss=True)
    size, sha = checkpoint_fingerprint(path)
    result = {
        "metrics": {
            "pp_tps": args.prompt_len / pp_s,
            "tg_tps": args.gen_len / tg_s,
            **tree_metrics(tree),
            **peak.metrics(),
            start.metric_name(cold): start_s,
        },
        "provenance": {
            "start_peak": peak.hwm(),
            "measured_differently": {
                "rss_anon_tree_mb": "RssAnon of one process; ik_llama.cpp mmaps the GGUF (with --repack on the "
                                    "repacked weights are anonymous memory)",
                "pp_tps": "one llama_decode of the prompt batch (llama-bench's pp), not a request through a scheduler",
                start.metric_name(cold): "launch to first token like every arm; ik_llama.cpp keeps no cache",
            },
            "platform": f"ik_llama.cpp via ik-llama-cpp-python {IK_VERSION} ({IK_DIR})",
            "worker_threads": threads,
            "worker_cpus": sorted(os.sched_getaffinity(0)),
            "model_path": path,
            "model_bytes": size,
            "model_sha256": sha,
            "quantization": "gguf (as stored in the file)" + (", repacked at load" if args.repack == "on" else ""),
            "head_dtype": "as stored in the GGUF",
            "patches": None,
            "load_s": load_s,
            "repack_tensors": args.repack == "on",
            "flash_attn": vnni,
            "flash_attn_reason": "on: the CPU has AVX-VNNI (the package's rule)" if vnni else
                                 "off: no AVX-VNNI, where the package turns it off (its CPU flash attention "
                                 "asserts on longer prompts)",
            "processes_ready": [p.to_dict() for p in tree],
            "params": vars(args),
        },
    }
    C.llama_free(ctx)
    C.llama_free_model(model)
    print(json.dumps(result), flush=True)
    return 0


def _has_avx_vnni() -> bool:
    """Whether ``/proc/cpuinfo`` lists ``avx_vnni``: the package's own rule for flash attention
    (``ik_llama_cpp/llama.py``, which reads the flag through py-cpuinfo, not installed here). AVX512-VNNI alone
    does not count there, so it does not here."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx_vnni" in flags


if __name__ == "__main__":
    sys.exit(main())
