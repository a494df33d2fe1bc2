"""The ``quant`` hook of the ``omni.extensions`` group, run by omni's general plugin.

It runs in every vLLM process (front end, engine core, worker), which is where the
``cpu_int4`` method must be registered (C05): the front end to validate the config,
the worker to build the layers. Repeating it is harmless.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Register the ``cpu_int4`` quantization config."""
    from vllm.model_executor.layers.quantization import register_quantization_config

    from omni_quant.config import QUANT_METHOD, CpuInt4Config

    register_quantization_config(QUANT_METHOD)(CpuInt4Config)
