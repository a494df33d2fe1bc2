"""Which kernel multiplies a cpu_int4 layer on this CPU, measured at load and cached.

Decode (a few rows) is memory-bound: omni's W4A8 kernel (:mod:`omni_quant.kernels.w4a8`) reads the
4-bit weights once at close to the machine's read bandwidth, on every CPU it runs on. Prefill
(hundreds of rows) is compute-bound, and which path wins depends on the CPU: on one with AMX or
AVX512-BF16, dequantizing the layer to bf16 for the step and calling torch's bf16 GEMM beats the
integer kernel from some row count on; on an AVX2-only CPU it may never. So the row count from
which a layer takes the dequantize path is measured here, per layer shape, on the CPU that runs
it (the two paths on the layer's own weights, rows 16..512, alternating, median of paired ratios), and cached
in ``$VLLM_CACHE_ROOT/omni/kernel_choice.json`` keyed by CPU model, flags, torch version, thread
count and shape. Both paths share one resident layout; the dequantize path only borrows a bf16
scratch buffer the size of the largest such layer.

Overrides (``omni_platform.envs``): ``OMNI_INT4_KERNEL`` (native / int4pack / auto) and
``OMNI_INT4_DEQUANT_MIN_ROWS`` (a row count, 0 never).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_quant.kernels import w4a8 as native

__all__ = ["Choice", "choose", "measure_dequant_min_rows", "verify_rows"]

logger = logging.getLogger("vllm.omni_quant.runtime.kernel_choice")

CALIBRATION_ROWS = (16, 32, 64, 128, 256, 512)
WIN_MARGIN = 0.9  # the dequantize path must take at most 90% of the native kernel's time
_memo: dict[tuple, int] = {}


@dataclass(frozen=True)
class Choice:
    """``kernel``: ``"native"`` or ``"int4pack"``; ``dequant_min_rows``: native only, rows from
    which the layer dequantizes to bf16 (0: never); ``reason``: why, for the log line."""

    kernel: str
    dequant_min_rows: int
    reason: str


def _setting(name: str):
    from omni_platform import envs

    return getattr(envs, name), envs.is_set(name)


def _cpu_key() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{model}|{','.join(native.supported_isas())}|kernel r{native.KERNEL_REVISION}|torch {torch.__version__}"
            f"|threads {torch.get_num_threads()}|calibration {CALIBRATION}")


def _cache_path() -> Path:
    from vllm import envs as vllm_envs

    return Path(vllm_envs.VLLM_CACHE_ROOT) / "omni" / "kernel_choice.json"


def _load_cache(path: Path) -> dict:
    """The cache as a dict; anything else (missing, unreadable, not JSON, not an object) is empty."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store_cache(path: Path, key: str, rows: int) -> None:
    """Add one entry, atomically (rename); a read-only cache directory only costs a re-measure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _load_cache(path)
        data[key] = rows
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernel_choice.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("omni-quant: kernel choice cache not written (%s)", exc)


CALIBRATION = 2
"""Part of the cache key: bumped when the measurement changes (2: paired, interleaved calls), so a
row count measured the old way is measured again."""
PAIRS = 5
"""Timed calls of each path per row count, alternating (native, dequantize, dequantize, native, ...)."""


def _time_s(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _paired_ratio(native_fn, dequant_fn, pairs: int = PAIRS) -> float:
    """Median over ``pairs`` neighbouring calls of (dequantize path time) / (native time).

    The two paths alternate in ABBA order after one untimed call of each, so a slower stretch of
    a shared host (another process, a frequency change) lands on both sides of a pair instead of
    deciding the comparison. The median of 3 separate calls per path, which this replaced, once
    sent Qwen2.5-Coder-1.5B's gate_up_proj to the bf16 path at 512 rows on an AVX-512 CPU whose
    native kernel is the faster one there: docs/cpu_int4.md, "Prefill", gives that run's artifacts.
    """
    native_fn()
    dequant_fn()
    ratios = []
    for i in range(pairs):
        if i % 2 == 0:
            t_native = _time_s(native_fn)
            t_dequant = _time_s(dequant_fn)
        else:
            t_dequant = _time_s(dequant_fn)
            t_native = _time_s(native_fn)
        ratios.append(t_dequant / t_native)
    return statistics.median(ratios)


def measure_dequant_min_rows(run, k: int, rows: tuple[int, ...] = CALIBRATION_ROWS) -> int:
    """Smallest row count in ``rows`` at which dequantize + bf16 GEMM takes at most
    ``WIN_MARGIN`` of the native kernel's time on these weights (median of :data:`PAIRS` paired
    ratios, :func:`_paired_ratio`); 0 if none.

    The largest row count is measured first: the dequantization is a fixed cost per call and both
    GEMMs grow with the rows, so a path that loses there loses at every smaller count, and a CPU
    whose bf16 GEMM is slow (no AVX512-BF16 or AMX: it converts every element) pays for one
    comparison, not one per row count.

    Args:
        run: ``(x, dequant_min_rows) -> y``, one layer in the kernel's layout
            (:func:`omni_quant.kernels.w4a8.linear` or :func:`omni_quant.kernels.w4a8.linear_super_blocks`);
            ``dequant_min_rows=0`` the native kernel, ``1`` the dequantize path.
        k: the layer's input features (the columns of ``x``).
        rows: the row counts to try, ascending.
    """
    gen = torch.Generator().manual_seed(0)

    def dequant_wins(m: int) -> bool:
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        return _paired_ratio(lambda: run(x, 0), lambda: run(x, 1)) <= WIN_MARGIN

    if not rows or not dequant_wins(rows[-1]):
        return 0
    return next(m for m in rows if m == rows[-1] or dequant_wins(m))


def verify_rows() -> int:
    """Rows one request brings to a speculative decoding verify step at most: 1 + ``num_speculative_tokens``
    of the vLLM config being loaded (``vllm/config/speculative.py``, 0.28; for suffix decoding vLLM sets it to
    ``suffix_decoding_max_tree_depth``). 0 without speculation or outside an engine."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:  # omni-quant's kernel used without vLLM
        return 0
    config = get_current_vllm_config_or_none()
    spec = getattr(config, "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None)
    return 1 + int(k) if k else 0


def choose(w_shape: tuple[int, int], group_size: int, is_head: bool, measure, layout: str = "groups") -> Choice:
    """The kernel for one ``[N, K]`` layer: :func:`_choose`, then kept off the prefill path for a verify step.

    A verify step scores a request's 1 + k drafted tokens at once where plain decoding scores one; both
    must take the W4A8 kernel, or greedy tokens change with speculation (the bf16 GEMM computes
    differently). So with speculation configured, a row count at or below :func:`verify_rows` is raised
    to one above it (the kernel decides per request: ``csrc/linear_ops.cpp``, ``switched_into``).
    """
    choice = _choose(w_shape, group_size, is_head, measure, layout)
    verify = verify_rows()
    if choice.kernel != "native" or not 0 < choice.dequant_min_rows <= verify:
        return choice
    return Choice("native", verify + 1, f"{choice.reason}; raised above a verify step's {verify} rows")


def _choose(w_shape: tuple[int, int], group_size: int, is_head: bool, measure, layout: str = "groups") -> Choice:
    """The kernel for one ``[N, K]`` layer, as measured or set.

    Args:
        w_shape: ``(N, K)``.
        group_size: the layer's group size (256 for super-blocks).
        layout: ``"groups"`` or ``"super_blocks"`` (:mod:`omni_quant.format.super_blocks`).
        is_head: the output head: it sees one row per sequence (vLLM computes logits only for
            the positions it samples), so it never takes the prefill path and is not measured.
        measure: ``() -> int``, runs :func:`measure_dequant_min_rows` on the layer once repacked
            (called only when neither the cache nor ``OMNI_INT4_DEQUANT_MIN_ROWS`` answers).

    Raises:
        ValueError: ``OMNI_INT4_KERNEL`` is not one of auto, native, int4pack, or asks for the
            native kernel where it cannot run (not built, or the shape does not fit it).
    """
    n, k = w_shape
    want, _ = _setting("OMNI_INT4_KERNEL")
    if want not in ("auto", "native", "int4pack"):
        raise ValueError(f"OMNI_INT4_KERNEL={want!r}: choose auto, native or int4pack")
    if want == "int4pack":
        return Choice("int4pack", 0, "OMNI_INT4_KERNEL=int4pack")
    fits = native.supports_shape(n, k, group_size) and (layout == "groups" or k % native.SUPER_BLOCK == 0)
    if not native.available() or not fits:
        why = (f"omni W4A8 kernel not built ({native.unavailable_reason()})" if not native.available()
               else f"[N={n}, K={k}] group {group_size} does not fit the omni W4A8 kernel "
                    "(N % 16, group_size % 16)")
        if want == "native":
            raise ValueError(f"OMNI_INT4_KERNEL=native: {why}; unset it to fall back to int4pack")
        return Choice("int4pack", 0, why)
    if is_head:
        return Choice("native", 0, "output head: decode rows only")
    rows, user_set = _setting("OMNI_INT4_DEQUANT_MIN_ROWS")
    if user_set:
        return Choice("native", rows, "OMNI_INT4_DEQUANT_MIN_ROWS")
    key = f"{_cpu_key()}|{n}x{k}|" + ("super_blocks" if layout == "super_blocks" else f"g{group_size}")
    if key in _memo:
        return Choice("native", _memo[key], "measured (this process)")
    path = _cache_path()
    cached = _load_cache(path).get(key)
    if type(cached) is int and 0 <= cached < 2**31:  # not a bool, not a float, fits the op's int64
        _memo[key] = cached
        return Choice("native", cached, f"measured earlier ({path})")
    rows = measure()
    _memo[key] = rows
    _store_cache(path, key, rows)
    return Choice("native", rows, "measured now")
