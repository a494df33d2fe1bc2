"""Arm runner: one ``vllm.LLM`` (omni with ``VLLM_PLUGINS=omni``) decoding the speculation workloads.

    python -m harness run-spec --model qwen2.5-coder-1.5b-int4
        [--speculative '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                         "prompt_lookup_max": 4}']
        [--workloads edit,qa,prose] [--max-tokens 256] [--enforce-eager]

``--speculative`` is vLLM's ``speculative_config`` as JSON; a ``"model"`` that names a
``harness.models.registry`` model is fetched and replaced by its path. ``--speculative ''`` (the
default) measures the engine as it starts without one (omni's default, whatever it is).

Each prompt of ``harness.workloads.prompts`` is sent alone (batch 1), as its chat template's token ids,
greedy (temperature 0), up to ``--max-tokens``, stopping at EOS as a user's request does.

Metrics, per workload W (``edit``, ``qa``, ``prose``):
- ``tg_W_tps``: sum over W's requests of (generated tokens - 1) / sum of (last token - first token
  time), tok/s: the decode rate from the first generated token, prefill excluded. The times are the
  engine core's own per-request stamps (``RequestOutput.metrics``: ``first_token_ts``,
  ``last_token_ts``; ``vllm/v1/metrics/stats.py`` RequestStateStats, vLLM 0.28).
- ``accept_W``: accepted / proposed draft tokens over W (vLLM's counters
  ``vllm:spec_decode_num_accepted_tokens`` / ``vllm:spec_decode_num_draft_tokens``), 0..1.
- ``accepted_len_W``: 1 + accepted tokens per draft (``.../num_drafts``): tokens a verify step
  emits on average, vLLM's "mean acceptance length".
The acceptance metrics are reported only when the engine speculates (given ``--speculative`` or by a
default of the platform's).

With ``--concurrency N`` (N > 1) the first N prompts of the workloads (cycled) are then sent at once:
``agg_tg_tps`` = their generated tokens after each one's first / seconds from the earliest first token to
the latest last token: what several streams decode together (where a batch-size schedule that stops
speculating from batch size 2 matters).

Provenance holds every prompt's id and sha256 and every request's generated token ids (``outputs``),
so that ``harness bench`` can assert equal greedy outputs across arms (spec key ``same_outputs``,
``harness/grid/outputs.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["main", "spec_counters", "decode_rate", "chat_token_ids"]

_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def spec_counters(metrics) -> dict[str, int]:
    """``{"drafts", "draft_tokens", "accepted_tokens"}`` summed over engines from ``LLM.get_metrics()``
    (zeros when the engine does not speculate: vLLM registers no such counters then)."""
    out = dict.fromkeys(_COUNTERS.values(), 0)
    for m in metrics:
        key = _COUNTERS.get(m.name)
        if key is not None:
            out[key] += int(m.value)
    return out


def decode_rate(requests: list[tuple[int, float]]) -> float:
    """tok/s from ``[(generated_tokens, seconds from first to last token)]``: sum(n - 1) / sum(s).

    Raises:
        ValueError: no request generated two tokens (no decode to time).
    """
    tokens = sum(n - 1 for n, _ in requests)
    seconds = sum(s for _, s in requests)
    if tokens <= 0 or seconds <= 0:
        raise ValueError(f"no decode to time: {tokens} tokens after the first in {seconds} s")
    return tokens / seconds


def chat_token_ids(tokenizer, prompt) -> list[int]:
    """The token ids a chat request of ``prompt`` (harness.workloads.prompts.Prompt) starts from: the
    tokenizer's chat template with the generation prompt, encoded without extra special tokens."""
    text = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _speculative_config(text: str) -> dict | None:
    if not text:
        return None
    cfg = json.loads(text)
    from harness.models.registry import MODELS, fetch

    if cfg.get("model") in MODELS:
        cfg["model"] = str(fetch(cfg["model"]))
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-spec", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-int4", help="a harness.models.registry name or a path")
    ap.add_argument("--speculative", default="", help="vLLM's speculative_config as JSON ('' for none)")
    ap.add_argument("--workloads", default="edit,qa,prose")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=268435456)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--concurrency", type=int, default=1, help="N > 1: also N prompts at once (agg_tg_tps)")
    args = ap.parse_args(argv)

    from harness.workloads.prompts import all_prompts

    names = tuple(w for w in args.workloads.split(",") if w)
    prompts = all_prompts(names)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a function
    from harness.models.registry import MODELS, fetch
    from harness.provenance import checkpoint_fingerprint

    model = str(fetch(args.model)) if args.model in MODELS else args.model
    spec = _speculative_config(args.speculative)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.models.recipe import EngineRecipe

    kwargs = EngineRecipe.from_args(model, args).llm_kwargs()
    if spec is not None:
        kwargs["speculative_config"] = spec
    llm = LLM(**kwargs, disable_log_stats=False)
    tokenizer = llm.get_tokenizer()
    # the engine's own config: omni's default speculates where --speculative named nothing
    speculates = llm.llm_engine.vllm_config.speculative_config is not None
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate([TokensPrompt(prompt_token_ids=[100 + i for i in range(16)])],
                 SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up, not measured

    metrics: dict[str, float] = {}
    outputs: dict[str, list[int]] = {}
    per_request: list[dict] = []
    for name in names:
        before = spec_counters(llm.get_metrics())
        timed: list[tuple[int, float]] = []
        for p in (p for p in prompts if p.workload == name):
            ids = chat_token_ids(tokenizer, p)
            t = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0]
            wall = time.perf_counter() - t
            stats = out.metrics
            if stats is None or not stats.first_token_ts:
                raise RuntimeError("vLLM returned no per-request timestamps (RequestOutput.metrics); "
                                   "the runner needs disable_log_stats=False")
            tokens = list(out.outputs[0].token_ids)
            decode_s = stats.last_token_ts - stats.first_token_ts
            timed.append((len(tokens), decode_s))
            outputs[p.id] = tokens
            per_request.append({"id": p.id, "prompt_tokens": len(ids), "generated": len(tokens),
                                "decode_s": decode_s, "wall_s": wall,
                                "finish_reason": out.outputs[0].finish_reason})
        metrics[f"tg_{name}_tps"] = decode_rate(timed)
        after = spec_counters(llm.get_metrics())
        delta = {k: after[k] - before[k] for k in after}
        if speculates:
            metrics[f"accept_{name}"] = delta["accepted_tokens"] / max(delta["draft_tokens"], 1)
            metrics[f"accepted_len_{name}"] = 1 + delta["accepted_tokens"] / max(delta["drafts"], 1)

    if args.concurrency > 1:
        batch = [prompts[i % len(prompts)] for i in range(args.concurrency)]
        outs = llm.generate([TokensPrompt(prompt_token_ids=chat_token_ids(tokenizer, p)) for p in batch], sp,
                            use_tqdm=False)
        first = min(o.metrics.first_token_ts for o in outs)
        last = max(o.metrics.last_token_ts for o in outs)
        metrics["agg_tg_tps"] = sum(len(o.outputs[0].token_ids) - 1 for o in outs) / (last - first)
        for p, o in zip(batch, outs, strict=True):
            want = outputs.get(p.id)
            per_request.append({"id": p.id, "concurrent": True, "generated": len(o.outputs[0].token_ids),
                                "equal_to_alone": want == list(o.outputs[0].token_ids) if want else None})

    from omni_platform.probe import worker_report

    w0 = llm.collective_rpc(worker_report)[0]
    size, sha = checkpoint_fingerprint(model)
    engine_spec = llm.llm_engine.vllm_config.speculative_config
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
            "quantization": (w0["extension_reports"].get("quant") or {}).get("method") or "see model_path",
            "head_dtype": w0.get("head_dtype"),
            "patches": w0["extension_reports"].get("patches", {}).get("applied"),
            "speculative_config_given": spec,
            "speculative_config_engine": None if engine_spec is None else {
                k: getattr(engine_spec, k, None) for k in (
                    "method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
                    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
                    "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob")},
            "enforce_eager": args.enforce_eager,
            "prompts": [p.to_dict() for p in prompts],
            "requests": per_request,
            "outputs": outputs,
            "params": vars(args),
        },
    }
    llm.llm_engine.engine_core.shutdown()
    print(json.dumps(result, default=str), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
