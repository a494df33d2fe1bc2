"""What a vLLM worker process sees: platform, CPU binding, threads, KV cache, extensions.

:func:`worker_report` is meant for ``LLM.collective_rpc`` (it runs inside each worker).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["rss_anon", "worker_report"]

_OMP_VARS = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")


def worker_report(worker: Any) -> dict[str, Any]:
    """Describe the worker process this runs in (call through ``collective_rpc``).

    Returns a JSON-able dict: ``pid``, ``ppid``, ``platform`` (dotted class name),
    ``rss_anon`` (bytes), ``affinity`` (CPU ids the main thread may run on), ``threads_cpus`` (union over
    all threads: the CPUs the OpenMP pool is bound to), ``torch_threads``, the OpenMP
    variables, ``extensions`` active in the worker and ``extension_reports`` (each active
    extension's own report about this worker), ``kv_cache`` with ``num_blocks`` and ``bytes``
    summed over the allocated KV cache tensors (``None`` before allocation), and the output
    head as vLLM built it (``head_dtype`` of its weight, None when an extension replaced it).
    """
    import torch

    from omni_platform.extensions import active_extensions, current_platform_qualname, reports

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
        "extension_reports": reports(worker),
        **_head_info(worker),
    }
    return report


def _head_info(worker: Any) -> dict[str, Any]:
    """dtype and quant method of the output head as loaded, and whether it is tied to the embedding."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    head = getattr(model, "lm_head", None)
    if head is None:
        return {"head_dtype": None, "head_quant_method": None, "head_tied": None}
    weight = getattr(head, "weight", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = weight is not None and embed is not None and getattr(embed, "weight", None) is weight
    method = getattr(head, "quant_method", None)
    return {
        "head_dtype": str(weight.dtype).removeprefix("torch.") if weight is not None else None,
        "head_quant_method": type(method).__name__ if method is not None else None,
        "head_tied": tied,
    }


def rss_anon() -> int:
    """RssAnon of this process, bytes (``/proc/self/status``).

    Raises:
        omni_platform.procfs.ProcFieldMissing: the kernel reports no RssAnon.
    """
    from omni_platform.procfs import status_bytes

    return status_bytes("RssAnon")


def _threads_cpus() -> list[int]:
    """Union of the CPU affinities of all threads of this process (OpenMP threads included)."""
    cpus: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            cpus |= os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(cpus)
