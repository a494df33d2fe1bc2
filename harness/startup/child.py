"""The profiled ``vllm.LLM`` start: what a user's script does, with three points of its own logged.

    python -m harness.startup.child --model DIR [--enforce-eager] [--kv-cache-memory-bytes N]

Run by ``python -m harness startup`` with ``VLLM_LOGGING_PREFIX`` set, so these lines carry the same
time stamps as vLLM's. Imports ``vllm``, builds ``LLM(...)`` with the harness's engine recipe, generates
one token of an 8-token prompt and exits. Logs ``startup: imports done``, ``startup: LLM ready`` and
``startup: first token`` on the ``vllm.harness.startup`` logger.
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.startup.child")
    ap.add_argument("--model", required=True, help="a checkpoint directory")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    ap.add_argument("--max-model-len", type=int, default=1024)
    args = ap.parse_args(argv)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.models.recipe import EngineRecipe

    log = logging.getLogger("vllm.harness.startup")
    log.info("startup: imports done")
    llm = LLM(**EngineRecipe.from_args(args.model, args).llm_kwargs())
    log.info("startup: LLM ready")
    out = llm.generate([TokensPrompt(prompt_token_ids=[100 + i for i in range(8)])],
                       SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1
    log.info("startup: first token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
