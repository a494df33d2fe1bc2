"""The ``quant`` hook of the ``omni.extensions`` group, run by omni's general plugin.

It runs in every vLLM process (front end, engine core, worker), which is where
``register_quantization_config("cpu_int4")`` must happen. The method itself is not
built yet (issue 4): the hook registers nothing so far.
"""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Register omni-quant's vLLM extensions in this process (none yet)."""
