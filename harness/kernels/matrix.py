"""The 4-bit kernel matrix: every reachable CPU kernel on the real linear shapes, per row count M.

    python -m harness kernels [--models smollm2-135m,qwen2.5-coder-1.5b] [--rows 1,2,4,8,16,64,256,512]
        [--threads 2] [--repeats 7] [--out harness/results/kernel_matrix-STAMP.json]
    python -m harness kernels table ARTIFACT      # the markdown tables the docs quote

Kernels (each on the same random 4-bit weights of each shape):

- ``int4pack``: ``aten._weight_int4pack_mm_for_cpu`` (PyTorch 2.13), what cpu_int4 runs today;
- ``w4a8``: vLLM's ``_C.int4_scaled_mm_cpu`` with cpu_int4's float zero points kept exact
  by the correction GEMM of :mod:`harness.kernels.vllm_w4a8`;
- ``w4a8_kernel``: the same vLLM kernel alone (integer zero point 8, no correction): the
  floor that the correction adds to;
- ``wna16``: ``_C.cpu_gemm_wna16``, what stock vLLM runs for GPTQ/AWQ checkpoints on a CPU
  without AMX (symmetric ``uint4b8``, layout from
  ``vllm/model_executor/kernels/linear/mixed_precision/cpu.py``);
- ``omni_w4a8_<isa>``: omni-quant's own W4A8 kernel (:mod:`omni_quant.kernels.w4a8`), float zeros fused, one
  entry per instruction-set path this CPU runs (avx512vnni, avx2vnni, avx2);
- ``omni_sb_<isa>``: omni-quant's super-block kernel (:func:`omni_quant.kernels.w4a8.linear_super_blocks`,
  Q4_K's arrangement, 4.625 bits a weight) on the same float weight fitted to super-blocks, checked
  against its own dequantized weight, one entry per path this CPU runs (avx512vnni, avx2); where K
  is a multiple of 256;
- ``zentorch``: AMD's ``zentorch_woq_linear`` (``zentorch`` 2.13.0.2, the pip-installable
  kernel library that matches torch 2.13; vLLM selects it on AMD Zen CPUs for GPTQ checkpoints,
  ``vllm/model_executor/kernels/linear/mixed_precision/zentorch.py``), integer zero point 8. Only
  when importable: ``make kernel-matrix`` installs it into ``.cache/zentorch`` beside, not into,
  the venv (installed there, vLLM would switch stock runs on Zen CPUs to its ZenCpuPlatform);
- ``dequant_bf16``: dequantize to bf16, then ``F.linear`` (a prefill path with no second
  resident layout);
- ``int8pack``: ``aten._weight_int8pack_mm``, the 8-bit weight-only kernel of the recipes that keep
  a tensor at 8 bits (symmetric, one scale per output channel; checked against the float weight);
- ``bf16``: ``F.linear`` on a resident bf16 weight (reads 4x the bytes; the reference).

Every kernel is first checked against the dequantized reference on 4 rows (SQNR in dB, recorded
as ``sqnr_db``; the kernels with an integer zero point against ``(q - 8) * s``): one that raises
or falls below ``MIN_SQNR_DB`` is not timed, and the artifact's ``failed`` names it with the reason
(zentorch on a CPU without AVX512-BF16 returns NaN).

Time is the median of ``--repeats`` rounds, microseconds; in each round every kernel runs once, in
turn (:func:`interleaved_us`), so that all of them sample the same stretches of a shared host. At
M <= 16 every call reads a different copy of the weights, enough copies to fill ``ROTATION_BYTES``
(512 MiB, at least two copies and at least twice the last-level cache of
``/sys/devices/system/cpu/cpu0/cache``), so decode is timed from memory, not from cache, as in a real
decode step, which streams the whole model. Twice the cache that sysfs shows is not enough: a
virtual machine may show 32 MiB while its two vCPUs sit on two chiplets with more L3 between them, and
one copy of a 117 MB head, reread, was timed faster than a streaming read of memory.

``gbps`` is the bytes of the kernel's own weight layout (codes, scales, zeros) / time. The ceiling is
the machine's read bandwidth (``torch.sum`` of float32 over ``ROTATION_BYTES``, same threads),
sampled once before every shape and, at M <= 16, before and after the kernels of every round (the
higher of the two is the round's): on a shared machine it moves
by half between seconds (17 to 52 GB/s in kernel_matrix-20261203T091646Z). At M <= 16 a round's sample
of a kernel is ``burst`` calls back to back on consecutive copies (at least ``BURST_BYTES``, 64 MiB, of
weights), per-call time = total / ``burst``. ``pct_paired_read`` (M <= 16) is the median
over rounds of the kernel's GB/s over the read's GB/s in the same round, the figure to quote; a cell
above 100% (``above_read``, printed with a warning and marked ``!`` in the table: a cache read, or a
host that slowed both reads of the round) is not a result;
``pct_ceiling`` divides by the highest read sample of the whole run (a lower bound). The artifact records
the CPU model and flags: the ranking of these kernels depends on them (AMX, AVX512-VNNI,
AVX-VNNI, AVX2).

``--huge-pages`` places every kernel's copies (and the read's buffer) as cpu_int4 places its weights
in the engine (:func:`omni_quant.runtime.huge_pages.place`). Linux may still give a copy 4 KiB pages where it
finds no free 2 MiB ones, so every row then records ``huge_share``: the share of the shape's placed bytes
that came on huge pages when placed and after the rounds of that row count (:func:`huge_share`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import RESULTS_DIR, provenance
from harness.memory.tree import anon_huge_bytes

__all__ = ["ROTATION_BYTES", "SHAPES", "llc_bytes", "main", "rotation_copies", "streaming_read"]

# name -> [(layer, N, K, group size)]: the linears of one decoder layer and the head.
SHAPES: dict[str, list[tuple[str, int, int, int]]] = {
    "smollm2-135m": [("qkv_proj", 960, 576, 32), ("o_proj", 576, 576, 32), ("gate_up_proj", 3072, 576, 32),
                     ("down_proj", 576, 1536, 32), ("lm_head", 49152, 576, 32)],
    "qwen2.5-coder-1.5b": [("qkv_proj", 2048, 1536, 128), ("o_proj", 1536, 1536, 128),
                           ("gate_up_proj", 17920, 1536, 128), ("down_proj", 1536, 8960, 128),
                           ("lm_head", 151936, 1536, 128)],
}
MEMORY_BOUND_ROWS = 16
ROTATION_BYTES = 512 << 20  # weight copies rotated per kernel at decode rows, and the read-bandwidth buffer
BURST_BYTES = 64 << 20  # weight bytes of one timed sample at decode rows (calls back to back), at least
MIN_SQNR_DB = 30.0  # int8 activation rounding costs a few dB below the ~40 dB of bf16 activations
GB = 1e9


def llc_bytes() -> int:
    """Size of the largest CPU cache level in bytes (sysfs); 32 MiB when unreadable."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        best = max(best, int(text.rstrip("KMG")) * mult)
    return best or 32 << 20


def streaming_read(buffer_bytes: int, huge: bool = False) -> Callable[[], float]:
    """A call that reads ``buffer_bytes`` of float32 once with ``torch.sum`` and returns GB/s (the
    kernels' ceiling, sampled in the same rounds as they are; float32 because torch's integer sums are
    not vectorized: int32 read at about 2 GB/s)."""
    import torch

    buf = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    if huge:  # on the same pages as the kernels' copies (huge_pages.place)
        from omni_quant.runtime import huge_pages

        buf = huge_pages.place(buf)
    buf.sum()

    def read() -> float:
        t = time.perf_counter()
        buf.sum()
        return buffer_bytes / (time.perf_counter() - t) / GB

    return read


def rotation_copies(one: int, llc: int, budget: int) -> int:
    """How many copies of a weight of ``one`` bytes a decode-row measurement rotates through: enough
    to fill ``max(ROTATION_BYTES, 2 * llc)`` bytes, at most ``budget`` bytes of them, never fewer than
    two (a single copy reread is timed from whatever cache the host has)."""
    want = -(-max(ROTATION_BYTES, 2 * llc) // max(one, 1))
    return max(2, min(want, budget // max(one, 1)))


def burst_calls(one: int, llc: int, copies: int) -> int:
    """Calls timed back to back in one sample at decode rows: enough to stream ``max(BURST_BYTES,
    2 * llc)`` bytes of weights of ``one`` bytes each, at most half the ``copies`` (the next kernel of
    the same copy set then starts on copies this burst did not touch)."""
    return max(1, min(-(-max(BURST_BYTES, 2 * llc) // max(one, 1)), copies // 2))


def interleaved_us(kernels: dict[str, Callable[[int], Any]], rounds: int, copies: int,
                   read: Callable[[], float] | None = None,
                   share: Callable[[str], str] = lambda name: name,
                   burst: int = 1) -> tuple[dict[str, list[float]], list[float]]:
    """Time every kernel once a round, ``rounds`` rounds, after one warm-up call each:
    ``({name: [microseconds per call, per round]}, [read GB/s per round])``.

    A round's sample of a kernel is ``burst`` calls back to back on consecutive copies, timed
    together and divided by ``burst``: a decode step streams one layer's weights after another, and a
    single GEMV of a few hundred microseconds timed alone measured the threads' wake-up and the
    host's scheduling as much as the kernel (the same kernel moved 3x between runs).

    The kernels alternate inside each round (and ``read()``, a streaming read returning GB/s, runs
    before and after them; the round's read is the higher of the two, so that one read slowed by
    the host does not lift the kernels' ratios above 100%: it did, to 117% on Qwen's head, in
    kernel_matrix runs of 2026-12-04) so that every kernel, and the ceiling, samples the same stretches of a
    shared host: timed one after the other, a kernel timed while a neighbour loaded the memory
    bus lost to one timed a second later by more than the kernels differ (the same reason as
    ``harness pages``' ABBA order). Kernels with the same ``share(name)`` read one set of copies
    (omni's kernel per instruction set) and advance one counter: call ``c`` of a set reads copy
    ``c % copies``, so a kernel never reads the copy it or a kernel of its set read last."""
    samples: dict[str, list[float]] = {name: [] for name in kernels}
    reads: list[float] = []
    counters: dict[str, int] = {}

    def next_copy(name: str) -> int:
        key = share(name)
        counters[key] = counters.get(key, -1) + 1
        return counters[key] % copies

    for name, fn in kernels.items():
        fn(next_copy(name))
    for _ in range(rounds):
        before = read() if read is not None else None
        for name, fn in kernels.items():
            idx = [next_copy(name) for _ in range(burst)]
            t = time.perf_counter()
            for i in idx:
                fn(i)
            samples[name].append((time.perf_counter() - t) * 1e6 / burst)
        if read is not None:
            reads.append(max(before, read()))
    return samples, reads


def copy_set(name: str) -> str:
    """Which set of weight copies kernel ``name`` reads: omni's kernels per instruction set share one
    (``omni_w4a8_<isa>`` one, ``omni_sb_<isa>`` another), and ``w4a8_kernel`` reads ``w4a8``'s. With a
    counter each, ``w4a8_kernel`` read the copy ``w4a8`` had just read, from the cache: 131% and 151% of
    the streaming read in kernel_matrix-20261204T033603Z."""
    if name == "w4a8_kernel":
        return "w4a8"
    for prefix in ("omni_w4a8_", "omni_sb_"):
        if name.startswith(prefix):
            return prefix
    return name


SYMMETRIC = {"w4a8_kernel", "wna16", "zentorch"}
"""Kernels with an integer zero point 8 (``w = (q - 8) * s``), not cpu_int4's float zeros."""


def _zentorch_kernel(q32, s, g: int, copies: int):
    """``zentorch_woq_linear`` on codes ``q32`` ``[N, K]`` with zero point 8, or None when
    zentorch is not importable (layout as vLLM's ``ZentorchWNA16LinearKernel`` builds it)."""
    import torch

    try:
        import zentorch  # noqa: F401  (registers torch.ops.zentorch)
    except ImportError:
        return None
    n, k = q32.shape
    packed = [torch.ops.zentorch.zentorch_woq_repack_weight(q32.to(torch.int8).contiguous()).t() for _ in range(copies)]
    scale_t = s.t().contiguous()                                        # [K/g, N] bf16
    zp_t = torch.full((k // g, n), 8, dtype=torch.int8)
    return lambda x, i: torch.ops.zentorch.zentorch_woq_linear(x, packed[i], scale_t, zp_t, None)


def _kernels(n: int, k: int, g: int, copies: int, huge: bool = False,
             placed: list[int] | None = None) -> dict[str, tuple[Callable, int]]:
    """``({kernel name: (call(x, copy index), bytes of one weight copy)}, (w, q, s, z))``: the
    kernels and the float weight ``[N, K]`` with its codes, scales and zeros. With ``huge``, every
    kernel's weight copies are placed as cpu_int4 places its weights in the engine
    (:func:`omni_quant.runtime.huge_pages.place`: transparent huge pages where the kernel allows them), and
    ``placed`` (if given) receives the bytes of each tensor that was moved."""
    import torch
    import torch.nn.functional as F

    from harness.kernels.vllm_w4a8 import repack_w4a8, w4a8_available, w4a8_linear
    from omni_quant.format.quant_math import quantize, quantize_int8
    from omni_quant.kernels import w4a8 as native
    from omni_quant.runtime import huge_pages

    def one(t):
        if not huge:
            return t
        p = huge_pages.place(t)
        if placed is not None and p is not t:
            placed.append(p.numel() * p.element_size())
        return p

    def pl(*ts):
        return tuple(map(one, ts))

    gen = torch.Generator().manual_seed(n * 7 + k)
    w = torch.randn(n, k, generator=gen) * 0.02
    q, s, z = quantize(w, g, torch.bfloat16)
    q32 = q.to(torch.int32)
    groups = k // g
    meta = 2 * n * groups * 2  # bf16 scales and zeros
    out: dict[str, tuple[Callable, int]] = {}

    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q32, 1)
    sz = torch.stack([s.t(), z.t()], dim=-1).contiguous()
    int4 = [pl(packed.clone(), sz.clone()) for _ in range(copies)]
    out["int4pack"] = (lambda x, i: torch.ops.aten._weight_int4pack_mm_for_cpu(x, int4[i][0], g, int4[i][1]),
                       n * k // 2 + meta)
    if w4a8_available():
        rep = repack_w4a8(q32, s, z, g)
        w4 = [pl(rep.weight.clone(), rep.zeros.clone(), rep.scales.clone(), rep.zero_t.clone()) for _ in range(copies)]
        out["w4a8"] = (lambda x, i: w4a8_linear(x, w4[i][0], w4[i][1], w4[i][2], w4[i][3], g),
                       n * k // 2 + meta // 2 + n * groups * 4)
        out["w4a8_kernel"] = (lambda x, i: torch.ops._C.int4_scaled_mm_cpu(x, w4[i][0], w4[i][1], w4[i][2], None),
                              n * k // 2 + meta // 2)
    if native.available() and native.supports_shape(n, k, g):
        om = [pl(*native.repack(q, s, z)) for _ in range(copies)]
        for isa in native.supported_isas():
            if isa == "scalar":
                continue  # the reference path, orders of magnitude slower: not a candidate
            out[f"omni_w4a8_{isa}"] = (lambda x, i, isa=isa: native.linear(x, om[i][0], om[i][1], g, None, isa),
                                      n * k // 2 + meta)
    w_sb = None
    if native.available() and n % 16 == 0 and k % native.SUPER_BLOCK == 0 and "avx2" in native.supported_isas():
        from omni_quant.format import super_blocks

        parts = super_blocks.quantize(w)
        w_sb = super_blocks.dequantize(*parts)
        sbs = [pl(*native.repack_super_blocks(*parts)) for _ in range(copies)]
        for isa in ("avx512vnni", "avx2"):
            if isa in native.supported_isas():
                out[f"omni_sb_{isa}"] = (
                    lambda x, i, isa=isa: native.linear_super_blocks(x, sbs[i][0], sbs[i][1], None, isa),
                    n * k // 2 + n * (k // 32) * 2 + n * (k // 256) * 4)
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        wn = _wna16_layout(q32)
        sc = s.t().contiguous()
        isa = "amx" if torch.cpu._is_amx_tile_supported() else "vec"
        wns = [one(wn.clone()) for _ in range(copies)]

        def wna16(x, i):
            y = torch.empty((x.shape[0], n), dtype=x.dtype)
            torch.ops._C.cpu_gemm_wna16(x, wns[i], y, sc, None, None, None, 8, isa)
            return y

        out["wna16"] = (wna16, n * k // 2 + meta // 2)
    zen = _zentorch_kernel(q32, s, g, copies)
    if zen is not None:
        out["zentorch"] = (zen, n * k // 2 + meta // 2)
    deq = [pl(q.to(torch.uint8).clone(), s.clone(), z.clone()) for _ in range(copies)]

    def dequant_bf16(x, i):
        qi, si, zi = deq[i]
        wd = ((qi.view(n, groups, g).to(torch.bfloat16) - 8) * si.unsqueeze(-1) + zi.unsqueeze(-1)).view(n, k)
        return F.linear(x, wd)

    out["dequant_bf16"] = (dequant_bf16, n * k + meta)  # codes held one a byte here
    q8, s8 = quantize_int8(w)
    i8 = [pl(q8.clone(), s8.clone()) for _ in range(max(2, -(-copies // 2)))]  # twice the bytes a copy
    out["int8pack"] = (lambda x, i: torch.ops.aten._weight_int8pack_mm(x, *i8[i % len(i8)]), n * k + n * 2)
    bf = [one(w.to(torch.bfloat16)) for _ in range(max(2, -(-copies // 4)))]  # four times
    out["bf16"] = (lambda x, i: F.linear(x, bf[i % len(bf)]), n * k * 2)
    return out, (w, q, s, z, w_sb)


def huge_share(before: int | None, after: int | None, placed: list[int]) -> float | None:
    """The share of ``placed`` bytes that came on huge pages: the growth of :func:`anon_huge_bytes`
    between ``before`` and ``after`` over their sum (None without a reading or without placed bytes).
    Approximate: khugepaged may collapse or the kernel split other huge pages of the process meanwhile."""
    if before is None or after is None or not sum(placed):
        return None
    return (after - before) / sum(placed)


def check(kernels: dict, weights, k: int) -> tuple[dict[str, float], dict[str, str]]:
    """Each kernel on 4 rows against its reference (the dequantized weight; ``bf16``: the float
    weight): ``({name: sqnr_db}, {name: reason})`` for the kernels that pass and those that raise
    or fall below ``MIN_SQNR_DB``."""
    import torch

    from omni_quant.format.quant_math import reference_linear, sqnr_db

    w, q, s, z, *rest = weights  # (w, q, s, z[, the super-block fit's dequantized weight or None])
    w_sb = rest[0] if rest else None
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    ref = {"ours": reference_linear(x, q, s, z), "sym8": reference_linear(x, q, s, torch.zeros_like(z)),
           "float": x.float() @ w.T, "super_blocks": x.float() @ w_sb.T if w_sb is not None else None}
    passed, failed = {}, {}
    for name, (fn, _) in kernels.items():
        try:
            kind = ("sym8" if name in SYMMETRIC else "float" if name in ("bf16", "int8pack")
                    else "super_blocks" if name.startswith("omni_sb_") else "ours")
            db = sqnr_db(ref[kind], fn(x, 0))
        except Exception as exc:  # a kernel this CPU cannot run: named, not fatal
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        if not db >= MIN_SQNR_DB:  # NaN included
            failed[name] = f"SQNR {db:.1f} dB against the dequantized reference (< {MIN_SQNR_DB} dB)"
        else:
            passed[name] = db
    return passed, failed


def _wna16_layout(q32):
    """cpu_int4 codes ``[N, K]`` -> ``cpu_gemm_wna16``'s blocked int32 layout (16 output channels a block)."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import pack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    n, k = q32.shape
    packed = pack_quantized_values_into_int32(q32.t().contiguous(), scalar_types.uint4b8, 1)  # [K, N/8]
    return packed.view(k, -1, 2).permute(1, 0, 2).reshape(-1, k * 2).contiguous()


def _pct(share: float | None) -> str:
    return "unknown" if share is None else f"{100 * share:.0f}%"


def _cell(row: dict) -> str:
    """``GB/s (percent)``: of the read in the same rounds where measured, else of the run's ceiling; a
    cell above the streaming read (``above_read``) ends in ``!``."""
    pct = row.get("pct_paired_read")
    mark = "!" if row.get("above_read") else ""
    return f"{row['gbps']:.1f} ({row['pct_ceiling'] if pct is None else pct:.0f}%){mark}"


def table(artifact: dict, rows: tuple[int, ...] = (1,), ms_rows: tuple[int, ...] = (16, 64, 512)) -> str:
    """Markdown of a kernel-matrix artifact: GB/s and % of the read (paired, else the run's ceiling) per kernel at
    ``rows``, then milliseconds at ``ms_rows``, one line per model and layer (what the docs quote)."""
    res = artifact["results"]
    kernels = list(dict.fromkeys(r["kernel"] for r in res))
    layers = list(dict.fromkeys((r["model"], r["layer"]) for r in res))
    at = {(r["model"], r["layer"], r["m"], r["kernel"]): r for r in res}
    measured = {r["m"] for r in res}
    rows, ms_rows = tuple(m for m in rows if m in measured), tuple(m for m in ms_rows if m in measured)
    out = [f"read ceiling {artifact['read_bandwidth_gbps']:.1f} GB/s (highest of "
           f"{len(artifact.get('read_bandwidth_samples_gbps', [1]))} samples, {artifact['threads']} threads); "
           f"{artifact['cpu'].get('cpu_model', '?')}, "
           f"cpu flags: {', '.join(artifact['cpu'].get('cpu_flags', [])) or '?'}"]
    for m in rows:
        out += ["", f"| model | layer (M={m}) | " + " | ".join(kernels) + " |", "|---|---|" + "---|" * len(kernels)]
        for model, layer in layers:
            cells = [_cell(at[model, layer, m, k]) if (model, layer, m, k) in at else "-" for k in kernels]
            out.append(f"| {model} | {layer} | " + " | ".join(cells) + " |")
    for m in ms_rows:
        out += ["", f"| model | layer (M={m}, ms) | " + " | ".join(kernels) + " |", "|---|---|" + "---|" * len(kernels)]
        for model, layer in layers:
            cells = [f"{at[model, layer, m, k]['us'] / 1e3:.2f}" if (model, layer, m, k) in at else "-"
                     for k in kernels]
            out.append(f"| {model} | {layer} | " + " | ".join(cells) + " |")
    for f in artifact.get("failed", []):
        out.append(f"\nnot timed: {f['kernel']} on {f['model']} {f['layer']}: {f['reason']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["table"]:  # python -m harness kernels table ARTIFACT
        print(table(json.loads(Path(argv[1]).read_text())))
        return 0
    ap = argparse.ArgumentParser(prog="python -m harness kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-1.5b")
    ap.add_argument("--rows", default="1,2,4,8,16,64,256,512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--copy-budget-mib", type=int, default=1536,
                    help="most MiB of weight copies per kernel and shape (decode rows)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="place every kernel's weight copies (and the read's buffer) as cpu_int4 places its weights "
                         "(transparent huge pages where allowed); default: where torch allocates them")
    ap.add_argument("--out", type=Path, default=None)
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    import torch

    out = args.out or RESULTS_DIR / ("kernel_matrix-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    prov, labels = provenance.begin_or_exit(out, "kernels", allow_dirty=args.allow_dirty)

    unknown = [m for m in args.models.split(",") if m not in SHAPES]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {sorted(SHAPES)}")
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    llc = llc_bytes()
    read_bytes = max(ROTATION_BYTES, 4 * llc)
    read = streaming_read(read_bytes, huge=args.huge_pages)  # one buffer for the whole run
    samples = []
    results, failed = [], []
    for model in args.models.split(","):
        for layer, n, k, g in SHAPES[model]:
            one = n * k // 2
            copies = rotation_copies(one, llc, args.copy_budget_mib << 20)
            samples.append(max(read() for _ in range(5)))  # best of 5 before each shape
            ceiling = max(samples)
            print(f"read bandwidth {samples[-1]:.1f} GB/s, highest so far {ceiling:.1f} "
                  f"({args.threads} threads, {read_bytes >> 20} MiB buffer)", flush=True)
            placed: list[int] = []
            huge_before = anon_huge_bytes()
            kernels, weights = _kernels(n, k, g, copies, huge=args.huge_pages, placed=placed)
            shares = [huge_share(huge_before, anon_huge_bytes(), placed)]
            sqnr, bad = check(kernels, weights, k)
            for name, why in bad.items():
                failed.append({"model": model, "layer": layer, "n": n, "k": k, "kernel": name, "reason": why})
                print(f"{model:20s} {layer:13s} {n:6d}x{k:<5d} {name}: not timed, {why}", flush=True)
                del kernels[name]
            for m in rows:
                x = torch.randn(m, k, dtype=torch.bfloat16)
                memory_bound = m <= MEMORY_BOUND_ROWS
                n_copies = copies if memory_bound else 1
                burst = burst_calls(one, llc, copies) if memory_bound else 1
                calls = {name: (lambda i, fn=fn, x=x, nc=n_copies: fn(x, i % nc)) for name, (fn, _) in kernels.items()}
                per_round, reads = interleaved_us(calls, args.repeats, n_copies, read if memory_bound else None,
                                                  share=copy_set, burst=burst)
                samples.extend(reads)
                shares = shares[:1] + [huge_share(huge_before, anon_huge_bytes(), placed)]
                if args.huge_pages:
                    print(f"  weight copies on huge pages: {_pct(shares[0])} when placed, {_pct(shares[1])} after "
                          f"the M={m} rounds ({sum(placed) >> 20} MiB placed)", flush=True)
                for name, (_fn, nbytes) in kernels.items():
                    us = statistics.median(per_round[name])
                    gbps = nbytes / (us * 1e-6) / GB
                    paired = (statistics.median(nbytes / (u * 1e-6) / GB / r for u, r in zip(per_round[name], reads,
                                                                                              strict=True))
                              if reads else None)
                    suspect = paired is not None and paired > 1.0  # faster than memory: read from a cache
                    results.append({"model": model, "layer": layer, "n": n, "k": k, "group_size": g, "m": m,
                                    "kernel": name, "us": us, "gbps": gbps, "pct_ceiling": None,
                                    "pct_paired_read": None if paired is None else 100 * paired,
                                    "above_read": suspect, "weight_bytes": nbytes, "copies": n_copies,
                                    "burst": burst, "sqnr_db": sqnr[name], "huge_share": shares})
                    print(f"{model:20s} {layer:13s} {n:6d}x{k:<5d} M={m:<4d} {name:13s} {us:10.1f} us "
                          f"{gbps:6.1f} GB/s" + (f" {100 * paired:5.1f}% of the read in its rounds" if reads else ""),
                          flush=True)
                    if suspect:
                        print(f"  WARNING: {name} above the streaming read in its rounds (its copies did not beat "
                              "the cache, or the host slowed both reads): do not quote this cell", flush=True)
            # before the next shape's copies (two shapes' sets at once ran out of 24 GiB)
            kernels = calls = weights = _fn = None
    ceiling = max(samples)
    for row in results:  # against the highest read bandwidth of the whole run
        row["pct_ceiling"] = 100 * row["gbps"] / ceiling
    artifact = {
        "kind": "kernel_matrix",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "threads": args.threads,
        "read_bandwidth_gbps": ceiling,
        "read_bandwidth_samples_gbps": samples,
        "llc_bytes": llc,
        "huge_pages": args.huge_pages,
        "results": results,
        "failed": failed,
        "provenance": prov,  # the clock probe before and after (cpu_speed_probe_s, _end_s): a shared host
        "labels": labels,
    }
    provenance.finish(prov, labels, out)
    provenance.write_artifact(out, artifact)
    print(f"artifact: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
