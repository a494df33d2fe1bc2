"""Arm runner: what a server holds before any long request, during one, and after it ends.

    python -m harness run-kv-residency --model qwen2.5-coder-1.5b-int4 [--extra ARGS] [--long-tokens 16000]
    python -m harness run-kv-residency --kind llama-server --model qwen2.5-coder-1.5b \
        --tokenizer qwen2.5-coder-1.5b-int4

Starts ``omni-vllm serve`` (``harness.load.servers``; omni's defaults, so with no ``--max-model-len`` in
``--extra`` the model's whole context), or llama.cpp's ``llama-server`` on the model's GGUF with its own
defaults (no ``-c``/``-np``: the context the GGUF declares, the slots it picks), sends one short chat request
and reads the server's process tree
(``harness.memory.tree``: RssAnon, RssFile, ...), then one completion request whose prompt is
``--long-tokens`` tokens (counted with the model's tokenizer) and reads the tree right after its answer,
then again ``--settle-s`` seconds later. Prints the arm JSON ``harness bench`` reads:

- ``kv_rss_anon_first_mb``: tree RssAnon after the first (short) request's answer, MiB;
- ``kv_rss_anon_long_mb``: after the long request's answer;
- ``kv_rss_anon_after_mb``: ``--settle-s`` seconds after it ended;
- ``kv_rss_total_first_mb`` / ``kv_rss_total_long_mb``: RssAnon + RssFile + RssShmem at those points.

With the KV cache zero-filled at start (``OMNI_PATCH_KV_LAZY_PAGES_OFF=1``) the first reading already holds
the whole budget; lazily mapped, it holds what the tokens written need.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from harness.server_process import post_json

__all__ = ["long_prompt", "main"]


def long_prompt(tokenizer, tokens: int) -> str:
    """A text of at least ``tokens`` tokens for ``tokenizer`` (at most 25 lines more): numbered lines of an
    inventory (no repeats a prefix cache could reuse across lines), then a question."""
    lines: list[str] = []
    while True:
        j = len(lines)
        lines.append(f"Item {j}: shelf {j % 97}, row {j % 13}, count {(j * 7919) % 1000}.")
        if j % 25 == 0 and len(tokenizer("\n".join(lines))["input_ids"]) >= tokens:
            return "\n".join(lines) + "\nHow many items are listed above?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness run-kv-residency", description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("omni", "llama-server"), default="omni")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-int4",
                    help="a harness.models.registry name (its GGUF for llama-server) or a path")
    ap.add_argument("--tokenizer", default=None, help="where the long prompt's tokens are counted (default --model)")
    ap.add_argument("--extra", default="", help="further omni-vllm serve arguments (one shell-quoted string)")
    ap.add_argument("--long-tokens", type=int, default=16000)
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from harness.load.servers import ServerSpec, start_server
    from harness.load.sweep import client_provenance
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.models.registry import MODELS, fetch, gguf_path

    def resolve(name: str, gguf: bool) -> str:
        return name if name not in MODELS else str(gguf_path(name) if gguf else fetch(name))

    model = resolve(args.model, args.kind == "llama-server")
    spec = ServerSpec(args.kind, model, args.extra, ctx_per_slot=None)
    prompt = long_prompt(AutoTokenizer.from_pretrained(resolve(args.tokenizer or args.model, False)),
                         args.long_tokens)
    server = start_server(spec, timeout_s=args.timeout)
    try:
        def mem():
            return tree_metrics(tree_memory(server.proc.pid))

        post_json(server.base + "/v1/chat/completions", {"model": "m", "max_tokens": 8, "temperature": 0,
                                                     "messages": [{"role": "user", "content": "Say hello."}]},
              args.timeout)
        first = mem()
        t = time.monotonic()
        out = post_json(server.base + "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 16,
                                                      "temperature": 0}, args.timeout)
        long_s = time.monotonic() - t
        long = mem()
        time.sleep(args.settle_s)
        after = mem()
    finally:
        server.stop()
    metrics = {"kv_rss_anon_first_mb": first["rss_anon_tree_mb"], "kv_rss_anon_long_mb": long["rss_anon_tree_mb"],
               "kv_rss_anon_after_mb": after["rss_anon_tree_mb"], "kv_rss_total_first_mb": first["rss_total_tree_mb"],
               "kv_rss_total_long_mb": long["rss_total_tree_mb"]}
    print(json.dumps({"metrics": metrics, "provenance": {
        **client_provenance(args.kind, spec), "command": server.command,
        "long_prompt_tokens": out["usage"]["prompt_tokens"], "long_request_s": long_s,
        "readings": {"first": first, "long": long, "after": after}}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
