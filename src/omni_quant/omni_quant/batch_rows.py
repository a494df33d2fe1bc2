"""Which rows of the current engine step belong to which sequence (request).

The cpu_int4 kernel (``omni_quant::w4a8_linear``, ``csrc/ops.cpp``) takes its prefill path
(dequantize + bf16 GEMM) from a measured row count on. Deciding on the whole step's rows would
make a request's numbers depend on what it was batched with: alone, a 10-token prompt would run
the W4A8 kernel; next to seven others (80 rows) the bf16 GEMM, and greedy outputs would differ
(C09 in docs/cases.md). So the kernel decides per sequence, from the row ranges this module
reads, and a request computes the same rows the same way alone or batched.

The ranges come from vLLM's forward context (``vllm/forward_context.py``, 0.28): the attention
metadata of the step holds ``query_start_loc`` ``[num_reqs + 1]`` (int32, the first row of each
request's tokens, then the total), the same for every attention layer of the step. The kernel
calls :func:`sequence_row_starts` only when a call has enough rows for the prefill path at all,
never at decode.
"""

from __future__ import annotations

__all__ = ["sequence_row_starts"]


def sequence_row_starts() -> tuple[int, ...] | None:
    """``query_start_loc`` of the engine step running now, as ints (``(0, s1, ..., total)``), or
    None outside an engine step (direct calls, tests, benchmarks; profiling runs without attention
    metadata; two micro-batches), where the caller treats all its rows as one sequence."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except ImportError:  # omni-quant's kernel used without vLLM
        return None
    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict):
        return None
    for layer_metadata in metadata.values():
        starts = getattr(layer_metadata, "query_start_loc", None)
        if starts is not None:
            return tuple(int(s) for s in starts.tolist())
    return None
