"""omni-quant's entry in the ``omni.extensions`` group: what omni's general plugin runs and asks.

:func:`extension` returns the :class:`~omni_platform.extensions.Extension`. Its activation runs
in every vLLM process (front end, engine core, worker), which is where the ``cpu_int4`` method
must be registered (C05): the front end to validate the config, the worker to build the layers;
repeating it is harmless. Its report says which kernel this CPU runs and, inside a worker,
how the model's layers were loaded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from omni_platform.extensions import Extension
from omni_quant.settings import SETTINGS

__all__ = ["extension", "register", "report"]


def register() -> None:
    """Register the ``cpu_int4`` quantization config, and the architectures whose decoder layers
    :mod:`omni_quant.runtime.fused_layers` fuses under cpu_int4."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from omni_quant.runtime import fused_layers
    from omni_quant.runtime.config import QUANT_METHOD, CpuInt4Config

    register_quantization_config(QUANT_METHOD)(CpuInt4Config)
    fused_layers.register()


def report(worker: Any = None) -> dict[str, Any]:
    """``method``, the W4A8 kernel this CPU runs (``native_isa``, or why it is missing); inside a
    worker also ``layers`` (cpu_int4 layers per kernel: native or int4pack), ``head`` (the
    output head's kernel, None when the head is not cpu_int4), ``fused_layers`` (decoder layers run as
    two ops, :mod:`omni_quant.runtime.fused_layers`) and ``embedding`` (the quantized input
    embedding's scheme, resident bytes and tensors' dtypes and shapes; None when it is bf16)."""
    from omni_quant.kernels import w4a8 as native
    from omni_quant.runtime import fused_layers, layout_cache
    from omni_quant.runtime.config import QUANT_METHOD

    out: dict[str, Any] = {"method": QUANT_METHOD, "native_isa": native.best_isa(),
                           "native_unavailable": native.unavailable_reason()}
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    if model is None:
        return out
    kernels = Counter(getattr(m, "cpu_int4_kernel", None) for m in model.modules())
    kernels.pop(None, None)
    out["layers"] = dict(kernels)
    head = getattr(model, "lm_head", None)
    out["head"] = getattr(head, "cpu_int4_kernel", None)
    # ``fused_layers``: decoder layers that run omni_quant.runtime.fused_layers' two ops (0: vLLM's layers everywhere)
    out["fused_layers"] = sum(fused_layers.is_fused(m) for m in model.modules())
    # ``layout``: layers mapped from a layout file, written to one, or copied (and why); its resident pages
    out["layout"] = layout_cache.report()
    emb = next((m for m in model.modules() if getattr(m, "cpu_int4_embedding_scheme", None)), None)
    out["embedding"] = None if emb is None else {  # None: a bf16 input embedding
        "scheme": emb.cpu_int4_embedding_scheme,
        "resident_bytes": sum(p.numel() * p.element_size() for p in emb.parameters(recurse=False)),
        "tensors": {n: [str(p.dtype).removeprefix("torch."), list(p.shape)]
                    for n, p in emb.named_parameters(recurse=False)},
    }
    return out


def extension() -> Extension:
    """omni-quant as an omni extension."""
    from omni_quant.conversion.gguf_cache import resolve_model

    return Extension(name="quant", distribution="omni-quant", activate=register, report=report, settings=SETTINGS,
                     resolve_model=resolve_model)
