"""What the converters write for the input embedding (format_version 4, :mod:`omni_quant.runtime.embedding`).

From a GGUF file (:func:`from_gguf`), ``token_embd`` keeps the file's type where cpu_int4 holds it:

- ``Q4_K``: super-blocks, bit for bit (codes, six-bit scales and mins, float16 ``d`` and ``dmin``);
- ``Q4_0``, ``Q4_1``: per group of 32, the codes bit for bit, the group constants rounded to bf16 (as the
  linear layers of those types, :mod:`omni_quant.format.gguf_blocks`);
- ``Q8_0``: 8-bit per group of 32, bit for bit (int8 codes and float16 ``d``);
- any other type (``Q5_x``, ``Q6_K``, ``F16``, ``BF16``, ``F32``, ...): dequantized and requantized to 8-bit
  per group of 32 (llama.cpp's Q8_0 rounding, :func:`omni_quant.format.quant_math.quantize_int8_groups`): an
  embedding stored above 4 bits is not brought down to 4.

From a bf16/fp16/fp32 checkpoint (:func:`from_float`), by the recipe: an 8-bit recipe (``q8``) writes 8-bit
per group of 32; a 4-bit one writes super-blocks when it writes them for linear layers (``q4k``) and D is a
multiple of 256, else per group at the preferred group size (or the largest smaller one dividing D).
Rounding is unweighted: calibration's E[x^2] weights a layer's input channels, and an embedding has
no input activations.

Where the embedding cannot be quantized, it is copied in bf16 and the report says why
(:func:`why_kept`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from omni_quant.format import super_blocks
from omni_quant.format.quant_math import (
    INT8_GROUP,
    GroupSizeError,
    choose_group_size,
    dequantize,
    dequantize_int8_groups,
    quantize,
    quantize_int8_groups,
    sqnr_db,
    sqnr_db_rows,
)

__all__ = ["KEEP_NAMES", "Written", "config_fields", "from_float", "from_gguf", "report", "why_kept"]

KEEP_NAMES = ("embed_tokens",)
"""Names ``--keep-bf16`` accepts for the input embedding besides its full checkpoint name."""


@dataclass(frozen=True)
class Written:
    """One quantized input embedding: checkpoint module name, scheme (:data:`omni_quant.runtime.embedding.SCHEMES`),
    its group size (32 for super-blocks and 8-bit), width in bits, the report's action, SQNR dB against the
    values it was made from (None when exact), bytes written."""

    module: str
    scheme: str
    group_size: int
    bits: int
    action: str
    sqnr_db: float | None
    bytes_out: int


def why_kept(structure, keep: list[str], tied_in_bf16: bool, fmt: str = "cpu_int4") -> str | None:
    """Why the input embedding of ``structure`` (:class:`omni_quant.conversion.structure.ModelStructure`) stays bf16, or
    None when it is quantized.

    Args:
        keep: the expanded ``--keep-bf16`` list (checkpoint names).
        tied_in_bf16: the output head stays tied to the embedding (vLLM then reads the head's weight from the
            embedding's bf16 table)."""
    module = structure.input_embedding
    if fmt != "cpu_int4":
        return f"--format {fmt} has no quantized embedding"
    if module is None:
        return "transformers names no input embedding for this model"
    if module in keep or module.rsplit(".", 1)[-1] in keep:
        return f"--keep-bf16 {module.rsplit('.', 1)[-1]}"
    if structure.head_is_embedding:
        return f"vLLM's {structure.architecture} computes the logits with the input embedding"
    if tied_in_bf16:
        return "the output head stays tied to it in bf16 (--keep-bf16 lm_head)"
    if not structure.embedding_takes_quant_config:
        return f"vLLM's {structure.architecture} builds its input embedding without the quantization config"
    return None


def _write(writer, module: str, scheme: str, parts: tuple[torch.Tensor, ...]) -> int:
    from omni_quant.conversion.output import write_codes, write_super_blocks

    if scheme == "groups":
        return write_codes(writer, module, *parts)
    if scheme == "super_blocks":
        return write_super_blocks(writer, module, *parts)
    q, d = parts
    writer.add(f"{module}.qweight8", q.to(torch.int8).contiguous())
    writer.add(f"{module}.scales8", d.to(torch.float16).contiguous())
    return q.numel() + d.numel() * 2


def _int8(writer, module: str, w: torch.Tensor, action: str) -> Written:
    q, d = quantize_int8_groups(w)
    db = sqnr_db_rows(w, lambda a, b: dequantize_int8_groups(q[a:b], d[a:b]))  # no float copy of the table
    return Written(module, "int8", INT8_GROUP, 8, action, round(db, 2), _write(writer, module, "int8", (q, d)))


def from_gguf(writer, module: str, raw: np.ndarray, kind: str, rows: int, cols: int,
              dequantized: Callable[[], np.ndarray], exact: bool = True) -> Written | None:
    """Write the GGUF embedding ``raw`` (type ``kind``, ``[rows, cols]`` = vocabulary x D) as ``module``; None
    when it cannot be held (D not a multiple of 32 and not an exact type: the caller copies it in bf16).

    Args:
        dequantized: returns the tensor's float32 values ``[rows, cols]`` (for the requantized types only).
        exact: the stored bytes are the tensor as transformers reads it (no reordering by its tensor
            processor); False requantizes every type.

    Raises:
        ValueError: the bytes do not match the shape, or a requantization is impossible (NaN, a range beyond
            float16 scales)."""
    from omni_quant.format.gguf_blocks import q8_0_parts, to_cpu_int4

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    if not exact:
        pass
    elif kind == "Q4_K" and super_blocks.fits(cols):
        parts = tuple(map(t, super_blocks.from_q4_k(raw, rows, cols)))
        return Written(module, "super_blocks", super_blocks.SUB_BLOCK, 4,
                       "embedding repacked from Q4_K in super-blocks", None,
                       _write(writer, module, "super_blocks", parts))
    elif kind in ("Q4_0", "Q4_1"):
        codes, s, z = map(t, to_cpu_int4(raw, kind, rows, cols))
        written = _write(writer, module, "groups", (codes, s, z))
        db = sqnr_db(dequantize(codes, s, z, torch.float32), dequantize(codes, s.to(torch.bfloat16),
                                                                         z.to(torch.bfloat16), torch.float32))
        return Written(module, "groups", 32, 4, f"embedding repacked from {kind}", round(db, 2), written)
    elif kind == "Q8_0":
        q, d = map(t, q8_0_parts(raw, rows, cols))
        return Written(module, "int8", INT8_GROUP, 8, "embedding repacked from Q8_0", None,
                       _write(writer, module, "int8", (q, d)))
    if cols % INT8_GROUP:
        return None
    values = np.array(dequantized(), dtype=np.float32).reshape(rows, cols)  # a copy: the file is mapped read-only
    return _int8(writer, module, torch.from_numpy(values),
                 f"embedding requantized from {kind} to 8 bits")


def from_float(writer, module: str, w: torch.Tensor, bits: int, in_super_blocks: bool,
               group_size: int) -> Written | None:
    """Quantize the float embedding ``w`` ``[V, D]`` by the recipe's width ``bits`` (4 or 8), in super-blocks
    when ``in_super_blocks`` and D allows, else per group at ``group_size`` or the largest smaller size dividing D;
    None when no scheme fits D (the caller copies it in bf16).

    Raises:
        ValueError: NaN or inf, or a range no scale holds."""
    d = w.shape[1]
    if bits == 8:
        return _int8(writer, module, w, "embedding quantized to 8 bits") if d % INT8_GROUP == 0 else None
    if in_super_blocks and super_blocks.fits(d):
        parts = super_blocks.quantize(w)
        db = sqnr_db_rows(w, lambda a, b: super_blocks.dequantize(*(p[a:b] for p in parts)))
        return Written(module, "super_blocks", super_blocks.SUB_BLOCK, 4, "embedding quantized in super-blocks",
                       round(db, 2), _write(writer, module, "super_blocks", parts))
    try:
        g = choose_group_size(d, group_size, module)
    except GroupSizeError:
        return None
    q, s, z = quantize(w, g, torch.bfloat16)
    db = sqnr_db_rows(w, lambda a, b: dequantize(q[a:b], s[a:b], z[a:b], torch.float32))
    return Written(module, "groups", g, 4, "embedding quantized", round(db, 2), _write(writer, module, "groups",
                                                                                        (q, s, z)))


def config_fields(written: Written | None) -> dict:
    """What :func:`omni_quant.conversion.output.cpu_int4_config` adds for the embedding: its name in
    ``embedding_modules``,
    its group size (``group_size_per_module``), 8 bits (``bits_per_module``) or super-blocks
    (``super_block_modules``). Empty when the embedding stays bf16."""
    if written is None:
        return {}
    return {"embedding_modules": [written.module],
            "group_size": {written.module: written.group_size} if written.bits == 4 else {},
            "bits8": [written.module] if written.bits == 8 else [],
            "super_blocks": [written.module] if written.scheme == "super_blocks" else []}


def report(written: Written | None, kept: str | None) -> dict:
    """The report's ``embedding`` entry: the quantized embedding's module, scheme, bits and bytes, or why it is bf16."""
    if written is None:
        return {"quantized": False, "why_not": kept}
    return {"quantized": True, "module": written.module, "scheme": written.scheme, "group_size": written.group_size,
            "bits": written.bits, "bytes": written.bytes_out}
