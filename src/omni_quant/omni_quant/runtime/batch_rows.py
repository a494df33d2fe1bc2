"""Which rows of the current engine step belong to which sequence (request).

The cpu_int4 kernel (``omni_quant::w4a8_linear``, ``csrc/linear_ops.cpp``) takes its prefill path
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

Should reading the ranges fail (an exception from vLLM's forward context, or the kernel getting a
malformed answer), the call's rows count as one sequence, as outside a step, and
:func:`report_failure` logs the reason once per process (logger ``vllm.omni_quant.runtime.batch_rows``):
batch invariance is then lost, and the log says so.
"""

from __future__ import annotations

import logging

__all__ = ["report_failure", "sequence_bounds", "sequence_row_starts"]

logger = logging.getLogger("vllm.omni_quant.runtime.batch_rows")
_failure_logged = False


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


def report_failure(reason: str) -> None:
    """Log, the first time in this process only, that the step's sequence rows could not be read
    (``reason``), so that the kernel took a call's rows as one sequence. Called by
    :func:`sequence_bounds` and by the kernel (``csrc/linear_ops.cpp``) on a malformed answer."""
    global _failure_logged
    if _failure_logged:
        return
    _failure_logged = True
    logger.warning("omni-quant: the rows of the engine step's sequences could not be read (%s); the W4A8 kernel "
                   "treats each call's rows as one sequence from now on, so a request batched with others may "
                   "not compute as it does alone (C09; logged once)", reason)


def sequence_bounds(rows: int) -> tuple[int, ...]:
    """Row boundaries of the requests among a call's ``rows`` rows: ``(0, s1, ..., rows)``, each
    range non-empty. Rows past the step's total (padding) are one more range. ``(0, rows)`` when
    there is no step, or when the step does not describe these rows (more rows than the call
    has, not ascending, not starting at 0): then the call's rows are one request. Never raises:
    an error reading the step gives ``(0, rows)`` and is logged once (:func:`report_failure`)."""
    try:
        starts = sequence_row_starts()
    except Exception as exc:  # vLLM's forward context changed shape, or anything else: the kernel must go on
        report_failure(f"{type(exc).__name__}: {exc}")
        starts = None
    fits = (starts is not None and len(starts) > 0 and starts[0] == 0 and starts[-1] <= rows
            and all(a <= b for a, b in zip(starts, starts[1:], strict=False)))
    bounds = [0]
    for s in starts if fits else ():
        if s > bounds[-1]:
            bounds.append(s)
    if bounds[-1] < rows:
        bounds.append(rows)
    return tuple(bounds)
