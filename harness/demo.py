"""The main job (``make demo``): serve the real model with vLLM + OmniPlatform, ask it, stop.

Starts vLLM's OpenAI-compatible server (``omni-vllm serve``, i.e. ``vllm serve``, in vLLM's
default compiled mode and OmniPlatform's default layout and step budget) on
127.0.0.1 with ``VLLM_PLUGINS=omni``, waits for ``/health``, sends one chat request
with the ``openai`` client (greedy, streamed), prints the reply, the engine start-up
seconds (launch to healthy) and the decode rate (tok/s, from the first streamed token
to the last), then stops the server's whole process group.

These two numbers are a demonstration from a single run, not a benchmark; published
numbers come from the harness (docs/methodology.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness.models.registry import REPO_ROOT, fetch
from harness.server_process import Server

__all__ = ["main"]

PROMPT = "Write two sentences about why small language models are useful on laptops."


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns 0 when the model answered, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m harness demo", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-int4",
                        help="a harness.models.registry name (default: the cpu_int4 checkpoint)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server")
    parser.add_argument(
        "--server-arg", action="append", default=[],
        help="extra argument for `vllm serve` (repeatable), e.g. --server-arg=--max-num-seqs=4",
    )
    args = parser.parse_args(argv)

    model_dir = fetch(args.model)
    log = REPO_ROOT / ".cache" / "demo-server.log"

    def cmd(port: int) -> list[str]:
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(model_dir),
                "--served-model-name", args.model, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", "2048", *args.server_arg]

    server = Server.start(cmd, log, env={**os.environ, "VLLM_PLUGINS": "omni"}, timeout_s=None)
    print(f"$ VLLM_PLUGINS=omni {' '.join(server.command)}\n  (server log: {log})", flush=True)
    with server:
        server.wait_healthy(args.timeout)
        startup_s = time.perf_counter() - server.launched
        from openai import OpenAI

        client = OpenAI(base_url=server.base + "/v1", api_key="unused")
        stream = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": args.prompt}],
            max_tokens=args.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        first = last = None
        completion_tokens = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                now = time.monotonic()
                first = first or now
                last = now
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                completion_tokens = chunk.usage.completion_tokens
    server_log = log.read_text(errors="replace")
    platform_ok = "Platform plugin omni is activated" in server_log
    print("\n--- reply ---")
    print("".join(pieces).strip())
    print("-------------")
    print(f"platform plugin omni activated in the server: {platform_ok}")
    said: set[str] = set()
    for line in server_log.splitlines():
        text = line.split("] ", 1)[-1]
        if "omni:" in line and text not in said:  # the front end and the engine core may both log a line
            said.add(text)
            print("  " + text)
    print(f"engine start-up: {startup_s:.1f} s (launch to /health OK)")
    if completion_tokens and first is not None and last is not None and completion_tokens > 1 and last > first:
        print(f"decode: {(completion_tokens - 1) / (last - first):.1f} tok/s "
              f"({completion_tokens} tokens, one stream, greedy)")
    else:
        print(f"decode: not measurable ({completion_tokens} completion tokens)")
    return 0 if pieces and platform_ok else 1


if __name__ == "__main__":
    sys.exit(main())
