"""What a vLLM worker process sees: platform, CPU binding, threads, KV cache, extensions.

:func:`worker_report` is meant for ``LLM.collective_rpc`` (it runs inside each worker);
:func:`make_tiny_llama` writes a small random Llama checkpoint so that an engine can be
started in seconds without any model download (``omni-info --worker``, tests).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["make_tiny_llama", "rss_anon", "worker_report"]

_OMP_VARS = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def worker_report(worker: Any) -> dict[str, Any]:
    """Describe the worker process this runs in (call through ``collective_rpc``).

    Returns a JSON-able dict: ``pid``, ``ppid``, ``platform`` (dotted class name),
    ``rss_anon`` (bytes), ``affinity`` (CPU ids the main thread may run on), ``threads_cpus`` (union over
    all threads: the CPUs the OpenMP pool is bound to), ``torch_threads``, the OpenMP
    variables, ``extensions`` active in the worker, ``patches`` applied (when
    omni-patches is installed), and ``kv_cache`` with ``num_blocks`` and ``bytes``
    summed over the allocated KV cache tensors (``None`` before allocation).
    """
    import torch

    from omni_platform.extensions import active_extensions, current_platform_qualname

    kv: dict[str, int] | None = None
    caches = getattr(getattr(worker, "model_runner", None), "kv_caches", None)
    if caches:
        tensors = [t for t in caches if isinstance(t, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        kv = {
            "num_blocks": int(tensors[0].shape[0]) if tensors else 0,
            "bytes": int(sum(storages.values())),
            "num_layers": len(tensors),
        }
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "platform": current_platform_qualname(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads_cpus": _threads_cpus(),
        "torch_threads": torch.get_num_threads(),
        "rss_anon": rss_anon(),
        "omp_env": {k: os.environ.get(k) for k in _OMP_VARS},
        "extensions": sorted(active_extensions()),
        "kv_cache": kv,
        "patches": _applied_patches(),
        **_head_info(worker),
    }
    return report


def _head_info(worker: Any) -> dict[str, Any]:
    """dtype and quant method of the output head as loaded, and whether it is tied to the embedding."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    head = getattr(model, "lm_head", None)
    if head is None:
        return {"head_dtype": None, "head_quant_method": None, "head_kernel": None, "head_tied": None}
    weight = getattr(head, "weight", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = weight is not None and embed is not None and getattr(embed, "weight", None) is weight
    method = getattr(head, "quant_method", None)
    if weight is not None:
        dtype = str(weight.dtype).removeprefix("torch.")
    elif getattr(head, "int4_weight", None) is not None or getattr(head, "w4a8_weight", None) is not None:
        dtype = "int4"  # omni-quant cpu_int4: 4-bit codes, no floating-point copy
    else:
        dtype = None
    return {
        "head_dtype": dtype,
        "head_quant_method": type(method).__name__ if method is not None else None,
        "head_kernel": getattr(head, "cpu_int4_kernel", None),  # cpu_int4: "native" or "int4pack"
        "head_tied": tied,
    }


def rss_anon() -> int:
    """RssAnon of this process, bytes (``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _threads_cpus() -> list[int]:
    """Union of the CPU affinities of all threads of this process (OpenMP threads included)."""
    cpus: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            cpus |= os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(cpus)


def _applied_patches() -> list[str] | None:
    try:
        from omni_patches import applied_patches
    except ImportError:
        return None
    return sorted(applied_patches())


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
