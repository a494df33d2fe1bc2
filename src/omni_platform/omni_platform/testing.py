"""Tiny models and a tiny engine: an engine in seconds with no model download.

:func:`make_tiny_llama` writes a small random Llama checkpoint; :func:`tiny_engine_reports`
starts a minimal eager engine on it (or on a given checkpoint) and returns
:func:`omni_platform.probe.worker_report` from every worker (``omni-info --worker``,
``omni-patches status --worker``, tests).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["make_tiny_llama", "tiny_engine_reports"]


PROBE_KV_BYTES = 64 << 20
"""KV cache of the probe engine (bytes) when OmniPlatform does not size it: 256 tokens of one sequence
need a few MiB even for an 8B model, where vLLM's CPU platform alone takes most of the node's memory
(vLLM 0.28 ``cpu_worker.py``: 21 of 23.5 GiB on a 24 GiB machine, a minute to allocate)."""


def tiny_engine_reports(model: str | None = None) -> list[dict[str, Any]]:
    """Start ``vllm.LLM`` (eager, ``max_model_len`` 256, one sequence) on ``model`` or on a tiny
    random Llama, return each worker's :func:`~omni_platform.probe.worker_report`, shut it down.

    Under OmniPlatform the KV cache is the platform's own choice (the report shows it); under another
    platform, unless ``VLLM_CPU_KVCACHE_SPACE`` is set, it is :data:`PROBE_KV_BYTES`."""
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a function
    from vllm import LLM
    from vllm.platforms import current_platform

    from omni_platform.platform import OmniPlatform
    from omni_platform.probe import worker_report

    extra: dict[str, Any] = {}
    if not isinstance(current_platform, OmniPlatform) and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        extra["kv_cache_memory_bytes"] = PROBE_KV_BYTES
    with tempfile.TemporaryDirectory(prefix="omni-tiny-") as tmp:
        llm = LLM(model=model or str(make_tiny_llama(tmp)), enforce_eager=True, skip_tokenizer_init=model is None,
                  max_model_len=256, max_num_seqs=1, **extra)
        try:
            return llm.collective_rpc(worker_report)
        finally:
            llm.llm_engine.engine_core.shutdown()


def make_tiny_llama(
    out_dir: str | os.PathLike[str],
    *,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    num_layers: int = 2,
    hidden_size: int = 128,
    intermediate_size: int = 256,
    vocab_size: int = 512,
    dtype: str = "float32",
    seed: int = 0,
) -> Path:
    """Write a random ``LlamaForCausalLM`` checkpoint (safetensors + config.json) to ``out_dir``.

    No tokenizer is written: load it with ``skip_tokenizer_init=True`` and token-id
    prompts. Weights are drawn from a seeded generator, so the same arguments give the
    same checkpoint. Returns ``out_dir`` as a ``Path``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        num_hidden_layers=num_layers,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    out = Path(out_dir)
    model.save_pretrained(out)
    return out
