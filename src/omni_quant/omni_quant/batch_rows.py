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
calls :func:`sequence_bounds` only when a call has enough rows for the prefill path at all,
never at decode.
"""

from __future__ import annotations

__all__ = ["sequence_bounds", "sequence_row_starts"]


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


def sequence_bounds(rows: int) -> tuple[int, ...]:
    """Row boundaries of the requests among a call's ``rows`` rows: ``(0, s1, ..., rows)``, each
    range non-empty. Rows past the step's total (padding) are one more range. ``(0, rows)`` when
    there is no step, or when the step does not describe these rows (more rows than the call
    has, not ascending, not starting at 0): then the call's rows are one request."""
    starts = sequence_row_starts()
    fits = (starts is not None and len(starts) > 0 and starts[0] == 0 and starts[-1] <= rows
            and all(a <= b for a, b in zip(starts, starts[1:], strict=False)))
    bounds = [0]
    for s in starts if fits else ():
        if s > bounds[-1]:
            bounds.append(s)
    if bounds[-1] < rows:
        bounds.append(rows)
    return tuple(bounds)
