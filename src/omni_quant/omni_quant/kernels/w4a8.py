"""omni-quant's own W4A8 CPU kernel: ``torch.ops.omni_quant.w4a8_linear``.

Built from ``src/omni_quant/csrc`` at install time (``setup.py``, against the installed torch);
absent when the build was unavailable, in which case :func:`available` is False and cpu_int4
multiplies with torch's ``aten._weight_int4pack_mm_for_cpu``.

What it computes, per row ``m`` and output channel ``n``, for cpu_int4's format
``w = (q - 8) * s + z`` (codes ``q`` 0..15, bf16 scale ``s`` and float zero ``z`` per group ``j``
of ``group_size`` input channels):

    y[m, n] = sum_j  s[n, j] * xs[m, j] * (sum_{k in j} q[n, k] * xq[m, k]  -  8 * sum_{k in j} xq[m, k])
                   + z[n, j] * X[m, j]

where ``xq`` are the activations quantized to int8 per (row, group) with scale ``xs`` (symmetric,
``max|x| / 127``, as llama.cpp's Q8_0 blocks) and ``X[m, j]`` is the exact float sum of the group's
activations: the float zero points are kept exact inside the kernel, no correction GEMM.
The integer dot products are ``vpdpbusd`` (AVX-512 VNNI, or AVX-VNNI on AVX2 CPUs) or
``vpmaddubsw`` with int16 sums of 4 chunks widened by one ``vpmaddwd`` (AVX2), chosen at run time
from the CPU's flags; a plain C++ kernel covers the rest. Weight layout (:func:`repack`): uint8
``[N/16, K/8, 16, 4]``, each byte the codes of input channels ``8c+i`` (low nibble) and ``8c+4+i``
(high nibble) for one of 16 output channels, so one 64-byte load feeds two ``vpdpbusd`` per row; scales and zeros bf16
``[N/16, K/group_size, 2, 16]`` next to each other: as many bytes as the checkpoint holds.
"""

from __future__ import annotations

import torch

from omni_quant.kernels import revision

__all__ = ["SUPER_BLOCK", "available", "best_isa", "dequantize", "dequantize_super_blocks", "linear",
           "linear_clock", "linear_super_blocks", "repack", "repack_super_blocks", "supported_isas", "supports_shape"]

try:
    from omni_quant.kernels import _w4a8  # noqa: F401  (registers torch.ops.omni_quant.w4a8_linear)
except ImportError as exc:  # built without the kernel (no compiler, or torch missing at build time)
    _w4a8 = None
    _IMPORT_ERROR: str | None = str(exc)
else:
    _IMPORT_ERROR = None

    @torch.library.register_fake("omni_quant::w4a8_linear")
    def _fake(x, w, sz, group_size, bias=None, isa="auto", dequant_rows=None):
        return x.new_empty((x.shape[0], w.shape[0] * 16))

    @torch.library.register_fake("omni_quant::dequantize")
    def _fake_dequantize(w, sz, group_size, isa="auto"):
        return w.new_empty((w.shape[0] * 16, w.shape[1] * 8), dtype=torch.bfloat16)

    @torch.library.register_fake("omni_quant::w4a8_linear_sb")
    def _fake_sb(x, w, sb, bias=None, isa="auto", dequant_rows=None):
        return x.new_empty((x.shape[0], w.shape[0] * 16))

    @torch.library.register_fake("omni_quant::norm_qkv_rope")
    def _fake_norm_qkv_rope(hidden_states, residual, norm_weight, eps, w, sb, bias, dequant_rows, positions,
                            cos_sin_cache, num_heads, num_kv_heads, head_size, rotary_dim, is_neox, isa="auto"):
        return hidden_states.new_empty((hidden_states.shape[0], w.shape[0] * 16)), torch.empty_like(hidden_states)

    @torch.library.register_fake("omni_quant::o_mlp")
    def _fake_o_mlp(attn, residual, wo, sbo, bias_o, rows_o, norm_weight, eps, wgu, sbgu, rows_gu, wd, sbd, rows_d,
                    isa="auto"):
        return residual.new_empty((attn.shape[0], wd.shape[0] * 16)), torch.empty_like(residual)

    @torch.library.register_fake("omni_quant::dequantize_sb")
    def _fake_dequantize_sb(w, sb, isa="auto"):
        return w.new_empty((w.shape[0] * 16, w.shape[1] * 8), dtype=torch.bfloat16)

BLOCK_N = 16
SUPER_BLOCK = 256
"""Input channels of a super-block (the super-block layout: 8 sub-blocks of 32)."""
SB_BYTES = 320
KERNEL_REVISION = revision.KERNEL_REVISION
"""The compiled kernels' revision (:data:`omni_quant.kernels.revision.KERNEL_REVISION`, kept in a module that does
not import torch so that reading it is cheap)."""


def available() -> bool:
    """Whether the compiled kernel is installed (``omni_quant.kernels._w4a8`` imports)."""
    return _w4a8 is not None


def unavailable_reason() -> str | None:
    """Why the kernel is missing (the import error), or None when it is installed."""
    return _IMPORT_ERROR


def linear_clock() -> tuple[int, int]:
    """``(ns, calls)``: wall nanoseconds spent inside ``w4a8_linear`` and ``w4a8_linear_sb`` in this
    process since the kernel was loaded, and how many calls; ``(0, 0)`` without the compiled kernel.

    Two readings around a decode request split its steps into the W4A8 GEMVs and the rest (vLLM's
    Python, the compiled graph's small kernels, attention, sampling) without a profiler; the GEMV part
    follows the host's memory bandwidth, the rest does not (``harness/arms/vllm.py``, ``tg_host_ms``).
    """
    return tuple(_w4a8.linear_clock()) if _w4a8 else (0, 0)


def supported_isas() -> list[str]:
    """Kernels this CPU can run, fastest first: a subset of avx512vnni, avx2vnni, avx2, scalar."""
    return _w4a8.supported_isas() if _w4a8 else []


def best_isa() -> str | None:
    """The kernel ``isa="auto"`` runs on this CPU, or None without the compiled kernel."""
    return _w4a8.best_isa() if _w4a8 else None


def super_block_isa() -> str | None:
    """The super-block kernel ``linear_super_blocks(isa="auto")`` runs on this CPU, or None without the
    compiled kernel: ``avx512vnni`` on AVX-512 VNNI CPUs, ``avx2`` on every other AVX2 CPU (AVX-VNNI
    ones included: no super-block kernel of their own), else ``scalar``. Mirrors ``sb_gemm`` in
    ``csrc/linear_ops.cpp``."""
    isa = best_isa()
    if isa is None or isa in ("avx512vnni", "scalar"):
        return isa
    return "avx2"


def supports_shape(n: int, k: int, group_size: int) -> bool:
    """Whether an ``[N, K]`` weight fits the kernel: N and K positive, N a multiple of 16, group_size a
    multiple of 16 (at most 256) dividing K."""
    return (n > 0 and k > 0 and n % BLOCK_N == 0 and group_size % 16 == 0 and 0 < group_size <= 256
            and k % group_size == 0)


def _check_codes(codes: torch.Tensor, where: str) -> None:
    """ValueError unless ``codes`` is a 2-D integer tensor of values 0..15 (a 16 would spill into the
    neighbouring nibble of the packed byte): names the dtype, or how many positions are out of range
    and the first one with its value."""
    if codes.dim() != 2:
        raise ValueError(f"{where}: codes must be 2-D [N, K], got shape {tuple(codes.shape)}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise ValueError(f"{where}: codes must be integers 0..15, got dtype {codes.dtype}")
    if codes.numel() == 0:
        return
    lo, hi = torch.aminmax(codes)
    if int(lo) >= 0 and int(hi) <= 15:
        return
    bad = (codes < 0) | (codes > 15)
    count = int(bad.sum())
    row, col = (int(i) for i in bad.nonzero()[0])
    raise ValueError(f"{where}: codes must be integers 0..15: {count} position(s) out of range, the first "
                     f"codes[{row}, {col}] = {int(codes[row, col])}")


def repack(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cpu_int4 weights -> the kernel's layout.

    Args:
        codes: ``[N, K]`` integer codes 0..15 (any integer dtype).
        scales, zeros: ``[N, K / group_size]`` (cast to bf16; cpu_int4 stores bf16).

    Returns:
        ``(w, sz)``: uint8 ``[N/16, K/8, 16, 4]`` and bf16 ``[N/16, K/group_size, 2, 16]``.

    Raises:
        ValueError: N or K is zero, N is not a multiple of 16 or K not a multiple of 8; ``codes`` is not
            an integer tensor or holds a value outside 0..15 (the message counts them and names the
            first); ``scales`` and ``zeros`` are not both ``[N, G]`` with G >= 1 dividing K.
    """
    _check_codes(codes, "omni_quant.kernels.w4a8.repack")
    n, k = codes.shape
    if n <= 0 or k <= 0 or n % BLOCK_N or k % 8:
        raise ValueError(f"omni_quant.kernels.w4a8.repack: [N={n}, K={k}] needs N > 0, K > 0, N % 16 == 0 "
                         "and K % 8 == 0")
    groups = scales.shape[1] if scales.dim() == 2 else 0
    if (scales.dim() != 2 or tuple(scales.shape) != (n, groups) or tuple(zeros.shape) != (n, groups)
            or groups < 1 or k % groups):
        raise ValueError(f"omni_quant.kernels.w4a8.repack: scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} "
                         f"must both be [N={n}, G] with G >= 1 groups dividing K={k}")
    c = codes.to(torch.uint8).view(n // BLOCK_N, BLOCK_N, k // 8, 8).permute(0, 2, 1, 3)
    w = (c[..., :4] | (c[..., 4:] << 4)).contiguous()
    sz = torch.stack([scales.to(torch.bfloat16), zeros.to(torch.bfloat16)], 0)       # [2, N, G]
    sz = sz.view(2, n // BLOCK_N, BLOCK_N, groups).permute(1, 3, 0, 2).contiguous()  # [N/16, G, 2, 16]
    return w, sz


def linear(x: torch.Tensor, w: torch.Tensor, sz: torch.Tensor, group_size: int,
           bias: torch.Tensor | None = None, isa: str = "auto",
           dequant_min_rows: int | torch.Tensor = 0) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W repacked by :func:`repack`.

    Args:
        x: ``[..., K]`` activations; bf16 and float32 go to the kernel as they are, other
            floating dtypes (float16) through float32.
        w, sz: from :func:`repack`; group_size: input channels per group.
        bias: optional ``[N]``.
        isa: ``"auto"`` (the best this CPU runs) or one of :func:`supported_isas` (tests).
        dequant_min_rows: from this many rows on (0: never), dequantize W to bf16 for the call
            and run torch's bf16 GEMM instead (prefill on CPUs with AMX or AVX512-BF16; the
            row count is chosen by measurement, :mod:`omni_quant.runtime.kernel_choice`). An int, or an
            int64 one-element tensor, which compiled graphs read at run time (the serving path).

    Returns:
        ``[..., N]`` in ``x``'s dtype.

    Raises:
        TypeError: ``x`` is not floating point.
        ValueError: ``x`` has K = 0 input channels (or no dimension).
        RuntimeError: from the kernel, before any arithmetic, naming the argument that is wrong: a
            shape (K or N zero, K not the one ``w`` was packed for, ``sz`` or ``bias`` not matching),
            ``group_size`` not a positive multiple of 16 up to 256 dividing K, a dtype, or an ``isa``
            this CPU cannot run.
    """
    shape = x.shape
    if not x.is_floating_point():
        raise TypeError(f"omni_quant.kernels.w4a8.linear: x must be floating point, got {x.dtype}")
    if x.dim() == 0 or shape[-1] == 0:
        raise ValueError(f"omni_quant.kernels.w4a8.linear: x must be [..., K] with K > 0, got shape {tuple(shape)}")
    if x.dtype not in (torch.bfloat16, torch.float32):  # e.g. a float16 model: the kernel reads bf16 or f32
        return linear(x.float(), w, sz, group_size, bias, isa, dequant_min_rows).to(x.dtype)
    rows = dequant_min_rows if isinstance(dequant_min_rows, torch.Tensor) else (
        torch.tensor(dequant_min_rows, dtype=torch.int64) if dequant_min_rows else None)
    y = torch.ops.omni_quant.w4a8_linear(x.reshape(-1, shape[-1]).contiguous(), w, sz, group_size, bias, isa, rows)
    return y.reshape(*shape[:-1], y.shape[-1])


def dequantize(w: torch.Tensor, sz: torch.Tensor, group_size: int, isa: str = "auto") -> torch.Tensor:
    """The kernel's layout back to the weight: bf16 ``[N, K]``, ``(q - 8) * s + z`` rounded to bf16.

    ``w``, ``sz`` from :func:`repack`. Raises RuntimeError (as :func:`linear`) on a wrong shape, dtype,
    ``group_size`` or ``isa``, K or N zero included."""
    return torch.ops.omni_quant.dequantize(w, sz, group_size, isa)


def repack_super_blocks(codes: torch.Tensor, sub_scales: torch.Tensor, sub_mins: torch.Tensor,
                        d: torch.Tensor, dmin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Super-block weights (``w = d * sc_j * q - dmin * m_j``, Q4_K's arrangement) -> the kernel's layout.

    Args:
        codes: ``[N, K]`` integer codes 0..15 (K a multiple of 256).
        sub_scales, sub_mins: ``[N, K / 32]`` integers 0..63 (one per sub-block of 32).
        d, dmin: ``[N, K / 256]`` float16 (one pair per super-block of 256).

    Returns:
        ``(w, sb)``: uint8 ``[N/16, K/8, 16, 4]`` (as :func:`repack`) and uint8 ``[N/16, K/256, 320]``:
        per block of 16 channels and super-block, ``sc[j][l]`` (128 bytes), the mins of sub-blocks
        ``2p, 2p+1`` side by side per channel ``m[p][l][2]`` (128), ``d[l]`` and ``dmin[l]`` fp16 (32 + 32).

    Raises:
        ValueError: N or K is zero, N is not a multiple of 16, K not of 256, a tensor's shape does not
            match, a code or six-bit integer is out of range, or ``d``/``dmin`` is not finite in float16.
    """
    _check_codes(codes, "omni_quant.kernels.w4a8.repack_super_blocks")
    n, k = codes.shape
    if n <= 0 or k <= 0 or n % BLOCK_N or k % SUPER_BLOCK:
        raise ValueError(f"omni_quant.kernels.w4a8.repack_super_blocks: [N={n}, K={k}] needs N > 0, K > 0, N % 16 == 0 "
                         "and K % 256 == 0")
    sbs = k // SUPER_BLOCK
    for name, t, cols in (("sub_scales", sub_scales, k // 32), ("sub_mins", sub_mins, k // 32),
                          ("d", d, sbs), ("dmin", dmin, sbs)):
        if tuple(t.shape) != (n, cols):
            raise ValueError(f"omni_quant.kernels.w4a8.repack_super_blocks: {name} is {tuple(t.shape)}, "
                             f"expected ({n}, {cols})")
    for name, t, hi in (("sub_scales", sub_scales, 63), ("sub_mins", sub_mins, 63)):
        if t.is_floating_point() or t.is_complex() or (t.numel() and not (0 <= int(t.min()) and int(t.max()) <= hi)):
            raise ValueError(f"omni_quant.kernels.w4a8.repack_super_blocks: {name} must be integers 0..{hi}")
    for name, t in (("d", d), ("dmin", dmin)):
        if not bool(torch.isfinite(t.to(torch.float16)).all()):
            raise ValueError(f"omni_quant.kernels.w4a8.repack_super_blocks: {name} must be finite in float16")
    w, _ = repack(codes, torch.zeros(n, 1), torch.zeros(n, 1))
    nb = n // BLOCK_N
    sc = sub_scales.to(torch.uint8).view(nb, BLOCK_N, sbs, 8).permute(0, 2, 3, 1)            # [nb, S, j, l]
    mn = sub_mins.to(torch.uint8).view(nb, BLOCK_N, sbs, 4, 2).permute(0, 2, 3, 1, 4)        # [nb, S, p, l, 2]
    dd = d.to(torch.float16).view(nb, BLOCK_N, sbs).permute(0, 2, 1).contiguous().view(torch.uint8)
    dm = dmin.to(torch.float16).view(nb, BLOCK_N, sbs).permute(0, 2, 1).contiguous().view(torch.uint8)
    sb = torch.cat([sc.reshape(nb, sbs, 128), mn.reshape(nb, sbs, 128), dd, dm], dim=2).contiguous()
    return w, sb


def linear_super_blocks(x: torch.Tensor, w: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None = None,
                        isa: str = "auto", dequant_min_rows: int | torch.Tensor = 0) -> torch.Tensor:
    """``x @ W.T (+ bias)`` with W in the super-block layout (:func:`repack_super_blocks`).

    The activations are quantized to int8 per (row, super-block of 256) with one scale ``xs``
    (``max|x| / 127``, llama.cpp's Q8_K) and the int sums ``bsum_j`` of each sub-block of 32; then per
    super-block ``y += xs * (d * sum_j sc_j * sum_{k in j} q xq  -  dmin * sum_j m_j * bsum_j)``, all in
    integers but the last step (llama.cpp's Q4_K x Q8_K dot product, ``ggml-cpu/arch/x86/quants.c``).
    AVX-512 VNNI (``vpdpbusd``, sub-block scales applied by ``vpmulld``) where the CPU has it, AVX2
    (``vpmaddubsw``, sub-block scales applied by the widening ``vpmaddwd``) on every other AVX2 CPU,
    plain C++ elsewhere or with ``isa="scalar"``. The two vector kernels give the same bits.

    Args:
        x: ``[..., K]``; bf16 and float32 as they are, other floating dtypes through float32.
        w, sb: from :func:`repack_super_blocks`. bias: optional ``[N]``.
        isa, dequant_min_rows: as :func:`linear`.

    Returns:
        ``[..., N]`` in ``x``'s dtype.

    Raises:
        TypeError: ``x`` is not floating point.
        ValueError: ``x`` has K = 0 input channels (or no dimension).
        RuntimeError: from the kernel, before any arithmetic, naming the argument that is wrong (K or N
            zero, K not a multiple of 256 or not the one ``w`` was packed for, ``sb`` or ``bias`` not
            matching, a dtype, an ``isa`` this CPU cannot run).
    """
    shape = x.shape
    if not x.is_floating_point():
        raise TypeError(f"omni_quant.kernels.w4a8.linear_super_blocks: x must be floating point, got {x.dtype}")
    if x.dim() == 0 or shape[-1] == 0:
        raise ValueError(f"omni_quant.kernels.w4a8.linear_super_blocks: x must be [..., K] with K > 0, "
                         f"got shape {tuple(shape)}")
    if x.dtype not in (torch.bfloat16, torch.float32):
        return linear_super_blocks(x.float(), w, sb, bias, isa, dequant_min_rows).to(x.dtype)
    rows = dequant_min_rows if isinstance(dequant_min_rows, torch.Tensor) else (
        torch.tensor(dequant_min_rows, dtype=torch.int64) if dequant_min_rows else None)
    y = torch.ops.omni_quant.w4a8_linear_sb(x.reshape(-1, shape[-1]).contiguous(), w, sb, bias, isa, rows)
    return y.reshape(*shape[:-1], y.shape[-1])


def dequantize_super_blocks(w: torch.Tensor, sb: torch.Tensor, isa: str = "auto") -> torch.Tensor:
    """The super-block layout back to the weight: bf16 ``[N, K]``, ``(d sc_j) q - (dmin m_j)`` rounded to bf16.

    ``w``, ``sb`` from :func:`repack_super_blocks`. Raises RuntimeError (as :func:`linear_super_blocks`)
    on a wrong shape, dtype or ``isa``, K or N zero included."""
    return torch.ops.omni_quant.dequantize_sb(w, sb, isa)
