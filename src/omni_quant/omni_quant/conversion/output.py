"""What every converter writes, and how: the output checkpoint's shards (``ShardWriter``), one quantized tensor
in each stored form (``write_codes``, ``write_quantized``, ``write_super_blocks``, ``write_int8``), the
``quantization_config`` and ``quantization_report.json``, and the temporary directory published by one rename
(``partial_dir``, ``publish``, ``discard``). Shared by the checkpoint converter (:mod:`.checkpoint`), the GGUF
converter (:mod:`.gguf_file`) and the embedding writer (:mod:`.embedding`).

Raises :class:`ConversionError` for input a converter cannot use."""

from __future__ import annotations

import errno
import glob
import json
import logging
import math
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from omni_quant.conversion.recipes import DEFAULT_RECIPE
from omni_quant.format import super_blocks
from omni_quant.format.packing import PackFormat, format_version_for, pack
from omni_quant.format.quant_math import ROW_BLOCK, dequantize, dequantize_int8, quantize, quantize_int8, sqnr_db_rows

logger = logging.getLogger("omni_quant.conversion.output")

__all__ = ["CONVERTER_VERSION", "SPACE_ERRNOS", "ConversionError", "discard", "out_of_space", "partial_dir",
           "publish", "ShardWriter", "TensorReport", "write_codes", "write_int8", "write_quantized",
           "write_quantized_super_blocks", "write_report", "write_super_blocks"]

CONVERTER_VERSION = "omni-quant-convert/6"
# 2: g32, weighted head; 3: recipes, all linears weighted; 4: GGUF too; 5: super-blocks (GGUF Q4_K kept as they are);
# 6: the input embedding quantized (format 4; GGUF token_embd kept in its type where cpu_int4 holds it)
SHARD_BYTES = 256 << 20


class ConversionError(RuntimeError):
    """Input the converter cannot use; the message says what and what to do. Nothing was written."""


SPACE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
                errno.EFBIG: "a file size limit was reached"}
"""The write errors that mean "no room": what each says (a full disk, a quota, ``ulimit -f``)."""


def out_of_space(exc: BaseException, dst: Path, need_bytes: int) -> ConversionError | None:
    """For a write that found no room (:data:`SPACE_ERRNOS`) while converting into ``dst``: one line naming the
    directory, what ran out, the space the conversion needs (``need_bytes``, an upper bound: the source's size)
    and what is free there; None for any other error. The caller has removed what it wrote."""
    if not isinstance(exc, OSError) or exc.errno not in SPACE_ERRNOS:
        return None
    try:
        free = f"; {shutil.disk_usage(dst.parent if dst.parent.exists() else Path('.')).free / 2**20:.0f} MiB are free"
    except OSError:
        free = ""
    return ConversionError(f"{dst.parent}: {SPACE_ERRNOS[exc.errno]} ({exc.strerror}) while writing {dst.name}: the "
                           f"conversion needs up to {need_bytes / 2**20:.0f} MiB there (the source's size){free}; "
                           "nothing was left behind: make room or choose another destination, then convert again")


@dataclass
class TensorReport:
    """One output tensor: name, shape ``[N, K]``, group size (None when copied; K for an 8-bit tensor,
    one scale per row), SQNR dB, bytes in and out, width in bits (None when copied).

    ``sqnr_db`` is None when copied, and also in ``quantization_report.json`` where the reconstruction
    is exact (an all-zero weight: SQNR infinite, which strict JSON cannot hold)."""

    name: str
    shape: list[int]
    action: str
    group_size: int | None
    sqnr_db: float | None
    bytes_in: int
    bytes_out: int
    bits: int | None = None


class ShardWriter:
    """Tensors into ``model-0000i.safetensors`` shards of at most ``SHARD_BYTES`` and their index."""

    def __init__(self, out: Path):
        self.out = out
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[str] = []
        self.weight_map: dict[str, str] = {}

    def add(self, name: str, t: torch.Tensor) -> None:
        self.pending[name] = t.contiguous()
        self.pending_bytes += t.numel() * t.element_size()
        if self.pending_bytes >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        fname = f"model-{len(self.files) + 1:05d}.safetensors"
        try:
            save_file(self.pending, str(self.out / fname), metadata={"format": "pt"})
        except Exception as e:  # noqa: BLE001 - safetensors reports an I/O error as its own type, "(os error N)"
            m = re.search(r"os error (\d+)", str(e))
            if m is None:
                raise
            raise OSError(int(m.group(1)), os.strerror(int(m.group(1))), str(self.out / fname)) from e
        self.files.append(fname)
        for k in self.pending:
            self.weight_map[k] = fname
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        self.flush()
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"converter": CONVERTER_VERSION}, "weight_map": self.weight_map}, indent=1))


def write_codes(writer: ShardWriter, module: str, codes: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor) -> int:
    """Write one cpu_int4 layer from its codes (uint8 ``[N, K]`` 0..15) and float32/bf16 scales and
    zeros ``[N, K/g]`` (stored bf16); return the bytes written."""
    writer.add(f"{module}.qweight", pack(codes.to(torch.uint8)))
    s, z = scales.to(torch.bfloat16), zeros.to(torch.bfloat16)
    writer.add(f"{module}.scales", s)
    writer.add(f"{module}.zeros", z)
    return codes.numel() // 2 + s.numel() * 2 + z.numel() * 2


def write_quantized(writer: ShardWriter, module: str, w: torch.Tensor, group_size: int,
                    importance: torch.Tensor | None = None) -> tuple[float, int]:
    """Quantize the float weight ``w`` ``[N, K]`` at ``group_size`` (each input channel's error weighted
    by ``importance`` ``[K]`` when given) and write it; return (SQNR dB, bytes)."""
    q, s, z = quantize(w, group_size, torch.bfloat16, importance=importance)
    db = sqnr_db_rows(w, lambda a, b: dequantize(q[a:b], s[a:b], z[a:b], torch.float32))  # no float copy of w
    return db, write_codes(writer, module, q, s, z)


def write_super_blocks(writer: ShardWriter, module: str, codes: torch.Tensor, sub_scales: torch.Tensor,
                       sub_mins: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor) -> int:
    """Write one cpu_int4 layer in super-blocks (:mod:`omni_quant.format.super_blocks`: codes uint8 ``[N, K]``,
    six-bit ``sub_scales``/``sub_mins`` ``[N, K/32]``, ``d``/``dmin`` ``[N, K/256]``, stored float16); return the
    bytes written."""
    parts = (pack(codes.to(torch.uint8)), sub_scales.to(torch.uint8), sub_mins.to(torch.uint8), d.to(torch.float16),
             dmin.to(torch.float16))
    for name, t in zip(super_blocks.TENSORS, parts, strict=True):
        writer.add(f"{module}.{name}", t.contiguous())
    return sum(t.numel() * t.element_size() for t in parts)


def write_quantized_super_blocks(writer: ShardWriter, module: str, w: torch.Tensor,
                                 importance: torch.Tensor | None = None) -> tuple[float, int]:
    """Fit the float weight ``w`` ``[N, K]`` (K a multiple of 256) to super-blocks
    (:func:`omni_quant.format.super_blocks.quantize`, weighted by ``importance`` ``[K]`` when given) and write it;
    return (SQNR dB, bytes).

    The fit runs ``ROW_BLOCK`` rows at a time (rows are independent; its float32 temporaries of a whole
    151936 x 1536 head took 5 GB), so its check of subnormal float16 steps judges each block of rows.

    Raises:
        ValueError: from the fit (NaN/inf, a range beyond float16 steps)."""
    blocks = [super_blocks.quantize(w[a:a + ROW_BLOCK], importance) for a in range(0, w.shape[0], ROW_BLOCK)]
    parts = tuple(torch.cat(p) for p in zip(*blocks, strict=True)) if len(blocks) > 1 else blocks[0]
    del blocks
    db = sqnr_db_rows(w, lambda a, b: super_blocks.dequantize(*(p[a:b] for p in parts)))
    return db, write_super_blocks(writer, module, *parts)


def write_int8(writer: ShardWriter, module: str, w: torch.Tensor) -> tuple[float, int]:
    """Quantize the float weight ``w`` ``[N, K]`` to 8 bits per output channel
    (:func:`omni_quant.format.quant_math.quantize_int8`) and write ``qweight8``/``scales8``; return (SQNR dB, bytes)."""
    q, s = quantize_int8(w)
    writer.add(f"{module}.qweight8", q)
    writer.add(f"{module}.scales8", s)
    return sqnr_db_rows(w, lambda a, b: dequantize_int8(q[a:b], s[a:b])), q.numel() + s.numel() * 2


def cpu_int4_config(group_size: int, keep: list[str], per_module: dict[str, int], structure,
                    bits8: list[str] | None = None, recipe: str = DEFAULT_RECIPE,
                    super_block_modules: list[str] | None = None, embedding: dict | None = None) -> dict:
    """The ``quantization_config`` of a cpu_int4 checkpoint: ``per_module`` gives the group size of each
    4-bit module (32 for one in super-blocks), ``bits8`` names the 8-bit ones (``bits_per_module``; format
    version 2), ``super_block_modules`` the 4-bit ones in super-blocks (format version 3), ``embedding`` the
    quantized input embedding's fields (:func:`omni_quant.conversion.embedding.config_fields`:
    ``embedding_modules``, its scheme in the same maps; format version 4; None when it stays bf16); what the
    loader must build unquantized is the keep list and every linear layer the converter copied, by full name."""
    extra = embedding or {}
    per_module = {**per_module, **extra.get("group_size", {})}
    bits_per_module = dict.fromkeys(sorted([*(bits8 or []), *extra.get("bits8", [])]), 8)
    super_block_modules = [*(super_block_modules or []), *extra.get("super_blocks", [])]
    quantized = set(per_module) | set(bits_per_module)
    return {
        "quant_method": "cpu_int4",
        "bits": 4,
        "group_size": group_size,
        "pack_format": PackFormat.NIBBLES_LOW_FIRST.value,
        "format_version": format_version_for({4, *bits_per_module.values()}, bool(super_block_modules),
                                             embedding is not None),
        "modules_to_not_convert": sorted(set(keep) | {
            n for n in structure.linear if n not in quantized and n.rsplit(".", 1)[-1] not in keep}),
        "group_size_per_module": per_module,
        **({"bits_per_module": bits_per_module} if bits_per_module else {}),
        **({"super_block_modules": sorted(super_block_modules)} if super_block_modules else {}),
        **({"embedding_modules": extra["embedding_modules"]} if embedding is not None else {}),
        "recipe": recipe,
        "converter_version": CONVERTER_VERSION,
    }


def write_report(out: Path, reports: list[TensorReport], **fields) -> dict:
    """``quantization_report.json``: ``fields``, per-tensor rows, bits per weight over the quantized
    tensors, bytes in and out, the lowest SQNR. Returns it."""
    reports = [replace(r, sqnr_db=None) if r.sqnr_db is not None and not math.isfinite(r.sqnr_db) else r
               for r in reports]
    quantized = [r for r in reports if r.group_size is not None]
    n_weights = sum(r.shape[0] * r.shape[1] for r in quantized)
    summary = {
        "converter_version": CONVERTER_VERSION,
        **fields,
        "bits_per_weight": (8 * sum(r.bytes_out for r in quantized) / n_weights) if n_weights else None,
        "bytes_in": sum(r.bytes_in for r in reports),
        "bytes_out": sum(r.bytes_out for r in reports),
        "min_sqnr_db": min((r.sqnr_db for r in quantized if r.sqnr_db is not None), default=None),
        "tensors": [asdict(r) for r in reports],
    }
    (out / "quantization_report.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    return summary


def publish(tmp: Path, dst: Path) -> None:
    """Make the finished checkpoint readable by every user and move it to ``dst`` in one rename.

    Raises:
        ConversionError: ``dst`` appeared meanwhile (nothing is written then)."""
    os.chmod(tmp, 0o755)  # mkdtemp made it private
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    try:
        os.rename(tmp, dst)  # fails if dst appeared meanwhile and is not empty
    except OSError as e:
        raise ConversionError(f"destination {dst} appeared while converting ({e}); nothing written") from e


def partial_dir(dst: Path) -> tuple[Path, list[Path]]:
    """A private temporary directory beside ``dst``, and the parents this call created (to remove on failure).

    Its name, ``.DST.partial-PID-XXXX``, carries the converting process's id: a conversion killed
    where it cannot clean up (SIGKILL, the OOM killer, a power cut) leaves its partial directory
    behind, and the next conversion to the same ``dst`` removes it once no process of that id runs
    (:func:`remove_stale_partials`).

    Raises:
        ConversionError: the directory cannot be created."""
    created = [p for p in (dst.parent, *dst.parent.parents) if not p.exists()]
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(dst)
        return Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-{os.getpid()}-", dir=dst.parent)), created
    except OSError as e:
        raise ConversionError(f"cannot create the output beside {dst}: {e}") from e


def remove_stale_partials(dst: Path) -> list[Path]:
    """Remove the partial directories of earlier conversions to ``dst`` whose process is gone; returns them.

    A directory whose process id still runs is left alone (another conversion, or a reused id: then it
    stays until a later run). Names without a process id are not ours to judge and stay too."""
    removed = []
    for p in dst.parent.glob(f".{glob.escape(dst.name)}.partial-*"):
        m = re.fullmatch(rf"\.{re.escape(dst.name)}\.partial-(\d+)-.+", p.name)
        if not (m and p.is_dir()) or _process_alive(int(m.group(1))):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
        logger.warning("omni-quant: removed %s, left by a conversion (process %s) that did not finish", p, m.group(1))
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def discard(tmp: Path, created: list[Path]) -> None:
    """Remove the partial output and the parents :func:`partial_dir` created, innermost first, if empty."""
    shutil.rmtree(tmp, ignore_errors=True)
    for p in created:
        try:
            p.rmdir()
        except OSError:
            break


