"""Arm runner: OpenVINO GenAI with int4 weights, the other runtime CPU users pick besides llama.cpp.

    .venv-ov/bin/python harness/arms/openvino.py --model qwen2.5-coder-1.5b [--prompt-len 512]
        [--gen-len 128] [--context-len 16]

Runs in a virtual environment of its own (``make ov-setup``: openvino-genai, optimum-intel,
nncf; their pins differ from vLLM's), on the OpenVINO IR that ``make ov-model`` exports from
the same bf16 checkpoint the vLLM arms derive from (``optimum-cli export openvino
--weight-format int4``: NNCF's data-free weight compression with its defaults for this model,
int4 asymmetric at group size 128 for the 196 linear layers of the decoder, int8 per channel
for the embedding and the output head, as the export prints). The IR lives at
``<model cache>/<model>-ov-int4``.

Metrics, the way ``harness.arms.llamacpp`` measures them: ``pp_tps`` = ``prompt_len`` / time to the
first token of a ``prompt_len``-token prompt (one prefill; OpenVINO GenAI's TTFT);
``tg_tps`` = 1000 / mean time per output token (TPOT, ms) over ``gen_len`` greedy tokens
after a ``context_len``-token prompt, EOS ignored; ``rss_anon_tree_mb`` = RssAnon of this
process (OpenVINO mmaps the IR's weights, file pages are not anonymous); ``start_cold_s`` /
``start_warm_s`` = launch to first token, as for every arm, with OpenVINO's compiled-model cache
(``CACHE_DIR``) in the arm's cache folder (harness/arms/start.py); ``load_s`` in the provenance.
Token ids are given directly (no text), as the other runners do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["ir_dir", "main", "require_ir"]

MiB = 1 << 20


def ir_dir(model: str) -> Path:
    """Where ``make ov-model`` puts the OpenVINO IR of ``model`` (a harness.models.registry name)."""
    from harness.models.registry import default_cache_dir

    return default_cache_dir() / f"{model}-ov-int4"


def require_ir(model: str, prog: str) -> Path | None:
    """The IR directory of ``model`` when openvino-genai is importable and ``make ov-model`` has written the IR;
    otherwise None, after printing to stderr, prefixed with ``prog``, what to run."""
    try:
        import openvino_genai  # noqa: F401
    except ImportError:
        print(f"{prog}: openvino-genai is not importable; run it with .venv-ov/bin/python after `make ov-setup`",
              file=sys.stderr)
        return None
    path = ir_dir(model)
    if not (path / "openvino_model.xml").is_file():
        print(f"{prog}: no OpenVINO IR at {path}; run `make ov-model`", file=sys.stderr)
        return None
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-openvino", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a model name (IR: make ov-model)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--context-len", type=int, default=16)
    args = ap.parse_args(argv)

    path = require_ir(args.model, "run_openvino")
    if path is None:
        return 2
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    from harness.arms import start
    from harness.memory.peak import TreePeak
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.provenance import checkpoint_fingerprint

    threads = len(os.sched_getaffinity(0))
    cache = os.environ.get("VLLM_CACHE_ROOT")
    cold = start.cache_is_empty(cache)
    config = {"INFERENCE_NUM_THREADS": threads}
    if cache:  # OpenVINO's compiled-model cache: what makes a warm start warm
        config["CACHE_DIR"] = str(Path(cache) / "openvino")
    peak = TreePeak(os.getpid()).start()
    t0 = time.perf_counter()
    pipe = ov_genai.LLMPipeline(str(path), "CPU", **config)
    load_s = time.perf_counter() - t0

    def run(n_prompt: int, n_new: int, offset: int):
        ids = np.array([[100 + ((i * 7919 + offset) % 40000) for i in range(n_prompt)]], dtype=np.int64)
        inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        config = ov_genai.GenerationConfig()
        config.max_new_tokens = n_new
        config.min_new_tokens = n_new
        config.ignore_eos = True
        config.do_sample = False
        return pipe.generate(inputs, config)

    run(8, 1, 99)  # warm-up, not measured, but its first token ends the start
    start_s = start.seconds_since_launch()
    peak.stop()
    start.mark_started(cache, "openvino")
    run(8, 2, 98)
    pp = run(args.prompt_len, 1, 1).perf_metrics
    ttft_ms = pp.get_ttft().mean
    tg = run(args.context_len, args.gen_len, 2)
    tpot_ms = tg.perf_metrics.get_tpot().mean
    generated = len(tg.tokens[0])
    if generated != args.gen_len:
        print(f"run_openvino: generated {generated} tokens, asked for {args.gen_len}", file=sys.stderr)
        return 1
    tree = tree_memory(os.getpid(), pss=True)
    size, sha = checkpoint_fingerprint(path)
    from importlib.metadata import version

    print(json.dumps({
        "metrics": {
            "pp_tps": args.prompt_len / (ttft_ms / 1000),
            "tg_tps": 1000 / tpot_ms,
            **tree_metrics(tree),  # rss_anon_tree_mb, rss_file_tree_mb, rss_total_tree_mb
            **peak.metrics(),  # peak_anon_tree_mb, peak_total_tree_mb: model load to first token
            start.metric_name(cold): start_s,
        },
        "provenance": {
            "start_peak": peak.hwm(),
            "measured_differently": {
                "rss_anon_tree_mb": "RssAnon of one process; OpenVINO mmaps the IR's weights: file pages, in "
                                    "rss_file_tree_mb (compare rss_total_tree_mb and pss_tree_mb)",
                "pp_tps": "prompt_len / OpenVINO GenAI's time to first token",
            },
            "platform": f"OpenVINO GenAI {version('openvino-genai')} (openvino {version('openvino')})",
            "worker_threads": threads,
            "worker_cpus": sorted(os.sched_getaffinity(0)),
            "model_path": str(path),
            "model_bytes": size,
            "model_sha256": sha,
            "quantization": "int4 weights (NNCF, optimum-cli export openvino --weight-format int4)",
            "head_dtype": "int8 per channel (NNCF's default for the output head, as the export prints)",
            "patches": None,
            "ov_config": config,
            "load_s": load_s,
            "ttft_ms": ttft_ms,
            "tpot_ms": tpot_ms,
            "processes_ready": [p.to_dict() for p in tree],
            "params": vars(args),
        },
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
