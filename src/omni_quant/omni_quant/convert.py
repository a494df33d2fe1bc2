"""The checkpoint converter: a bf16/fp16/fp32 Hugging Face checkpoint of any architecture vLLM serves
to cpu_int4.

What is quantized is read from the model's structure (:mod:`omni_quant.structure`: the linear
layers transformers builds for it, on the meta device), not from its architecture's name: the
input embedding stays a lookup and everything else is copied. ``--keep-bf16`` takes checkpoint
names (``q_proj``) or vLLM's fused names (``qkv_proj``, all its members); keeping part of a
fused layer is refused with its partners named.

Streams tensor by tensor (``safetensors.safe_open``; output written in shards of at
most ``SHARD_BYTES``), so peak memory is bounded by one shard plus the largest tensor,
not by the model. Writes into a temporary directory beside ``DST`` and renames it only
when complete: a failure leaves nothing at ``DST``.

Tied embeddings (C04): when the output head is tied to the input embedding and not
named in ``keep_bf16``, the converter writes a quantized ``lm_head`` (made from the
embedding, or from ``lm_head.weight`` when the checkpoint also carries one) beside the
bf16 embedding table used for lookups, and sets ``tie_word_embeddings: false``. With
``keep_bf16=["lm_head"]`` the tie is kept and the head runs in bf16.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omni_quant.calibration import CalibrationError, head_input_importance
from omni_quant.gptq import dequantize_sym, pack_gptq, quantize_sym
from omni_quant.packing import FORMAT_VERSION, PackFormat, pack
from omni_quant.quant_math import GROUP_SIZES, GroupSizeError, choose_group_size, dequantize, quantize, sqnr_db
from omni_quant.structure import StructureError, model_structure

__all__ = ["CONVERTER_VERSION", "FORMATS", "ConversionError", "TensorReport", "convert"]

CONVERTER_VERSION = "omni-quant-convert/2"  # 2: default group size 32, importance-weighted head
DEFAULT_GROUP_SIZE = 32
SHARD_BYTES = 256 << 20
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
COPIED_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "generation_config", "chat_template", "vocab",
                        "merges", "added_tokens")
"""Non-weight files of the source carried over (tokenizer and generation settings)."""


class ConversionError(RuntimeError):
    """Input the converter cannot use; the message says what and what to do. Nothing was written."""


@dataclass
class TensorReport:
    """One output tensor: name, shape ``[N, K]``, group size (None when copied), SQNR dB, bytes in and out."""

    name: str
    shape: list[int]
    action: str
    group_size: int | None
    sqnr_db: float | None
    bytes_in: int
    bytes_out: int


def _tensor_inventory(src: Path, config: dict) -> dict[str, Path]:
    """Which tensors of ``src`` make the model, and the file each is read from.

    With ``model.safetensors.index.json`` the model is exactly the names its
    ``weight_map`` lists, each read from the file it names (as transformers loads
    them; a stray tensor in a shard is ignored). Without one, it is every tensor of
    ``model.safetensors``. Shard names are checked as names, so the symlinks of a
    Hugging Face cache snapshot (pointing into ``blobs/``) are accepted. Each layer
    ``0 .. num_hidden_layers - 1`` of ``config`` must have at least one tensor.

    Raises:
        ConversionError: no safetensors checkpoint; a malformed or empty index; a
            shard name that leaves ``src`` or is missing or unreadable; an index entry
            whose shard lacks the tensor; layers missing.
    """
    from safetensors import SafetensorError, safe_open

    index = src / "model.safetensors.index.json"
    fix = "re-export the checkpoint, or point SRC at a complete Hugging Face checkpoint"
    if index.is_file():
        try:
            raw = json.loads(index.read_text())["weight_map"]
            if not isinstance(raw, dict) or not all(isinstance(f, str) for f in raw.values()):
                raise ValueError("weight_map must map tensor names to file names")
        except KeyError:
            raise ConversionError(f"{index} has no weight_map; {fix}") from None
        except (ValueError, TypeError, AttributeError) as e:
            raise ConversionError(f"{index} is not a valid safetensors index: {e}; {fix}") from e
        if not raw:
            raise ConversionError(f"{index} lists no tensors; {fix}")
        files = {f: os.path.normpath(f) for f in set(raw.values())}
        outside = sorted(f for f, n in files.items() if os.path.isabs(n) or n == "." or n.split(os.sep)[0] == "..")
        if outside:
            raise ConversionError(f"{index} points outside the checkpoint: {outside}; {fix}")
        wanted = {name: files[f] for name, f in raw.items()}
    elif (src / "model.safetensors").is_file():
        wanted = None
        files = {"model.safetensors": "model.safetensors"}
    else:
        raise ConversionError(f"{src} holds no model.safetensors (nor an index); convert a safetensors checkpoint")
    keys: dict[str, set[str]] = {}
    for rel in sorted(set(files.values())):
        path = src / rel
        try:
            if not path.is_file():
                raise ConversionError(f"{path} is listed by the index but is not a file; {fix}")
            with safe_open(str(path), framework="pt") as f:
                keys[rel] = set(f.keys())
        except (SafetensorError, OSError, ValueError) as e:
            raise ConversionError(f"{path} is not a readable safetensors file: {e}; {fix}") from e
    if wanted is None:
        names = {k: src / "model.safetensors" for k in keys["model.safetensors"]}
    else:
        absent = sorted(k for k, rel in wanted.items() if k not in keys[rel])
        if absent:
            raise ConversionError(
                f"{index} lists tensors that are not in the file it names: {', '.join(absent[:5])}"
                f"{' ...' if len(absent) > 5 else ''}; the index and the shards disagree: {fix}")
        names = {k: src / rel for k, rel in wanted.items()}
    n_layers = config.get("num_hidden_layers")
    if isinstance(n_layers, int) and n_layers > 0:
        present = {int(m.group(1)) for m in map(_LAYER.search, names) if m}
        missing = sorted(set(range(n_layers)) - present)
        if missing:
            raise ConversionError(
                f"{src}: config.json says num_hidden_layers={n_layers} but the checkpoint has no tensor of "
                f"layer(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}; a truncated checkpoint: {fix}")
    return names


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


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
        save_file(self.pending, str(self.out / fname), metadata={"format": "pt"})
        self.files.append(fname)
        for k in self.pending:
            self.weight_map[k] = fname
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        self.flush()
        (self.out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"converter": CONVERTER_VERSION}, "weight_map": self.weight_map}, indent=1))


_ShardWriter = ShardWriter  # the name tests patch


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
    db = sqnr_db(w, dequantize(q, s, z, torch.float32))
    return db, write_codes(writer, module, q, s, z)


def cpu_int4_config(group_size: int, keep: list[str], per_module: dict[str, int], structure) -> dict:
    """The ``quantization_config`` of a cpu_int4 checkpoint: what the loader must build unquantized is
    the keep list and every linear layer the converter copied, by its full name."""
    return {
        "quant_method": "cpu_int4",
        "bits": 4,
        "group_size": group_size,
        "pack_format": PackFormat.NIBBLES_LOW_FIRST.value,
        "format_version": FORMAT_VERSION,
        "modules_to_not_convert": sorted(set(keep) | {
            n for n in structure.linear if n not in per_module and n.rsplit(".", 1)[-1] not in keep}),
        "group_size_per_module": per_module,
        "converter_version": CONVERTER_VERSION,
    }


def write_report(out: Path, reports: list[TensorReport], **fields) -> dict:
    """``quantization_report.json``: ``fields``, per-tensor rows, bits per weight over the quantized
    tensors, bytes in and out, the lowest SQNR. Returns it."""
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
    (out / "quantization_report.json").write_text(json.dumps(summary, indent=1) + "\n")
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


FORMATS = ("cpu_int4", "gptq")


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], group_size: int = DEFAULT_GROUP_SIZE,
            keep_bf16: list[str] | None = None, fmt: str = "cpu_int4",
            weighted_head: bool = True) -> list[TensorReport]:
    """Convert ``src`` to a cpu_int4 checkpoint at ``dst``; returns the per-tensor report.

    The default recipe: every linear layer 4-bit at group size 32 (5.0 bits per weight with the
    bf16 scale and zero of each group), the output head's rounding weighted by what its input
    carries (:func:`omni_quant.calibration.head_input_importance`; skipped, and the report says
    why, when the model cannot run here; ``weighted_head=False`` leaves it unweighted). Its
    measured fidelity: docs/cpu_int4.md, the recipe table, each row from its artifact.

    ``fmt="gptq"`` writes stock vLLM's GPTQ format instead (:mod:`omni_quant.gptq`: symmetric
    round to nearest, one group size for every layer, the output head kept in bf16 as GPTQ
    checkpoints do): the baseline omni is compared with, not an omni format.

    Raises:
        ConversionError: missing or corrupt input, an architecture vLLM does not serve, an
            unsupported dtype, an existing ``dst``, an untied config without ``lm_head.weight``,
            a keep list naming part of a fused layer, or a K no supported group size divides.
            ``dst`` does not exist afterwards then.
    """
    from safetensors import SafetensorError, safe_open

    src, dst = Path(src), Path(dst)
    keep = list(keep_bf16 or [])
    if fmt not in FORMATS:
        raise ConversionError(f"--format {fmt} is not one of {FORMATS}")
    if fmt == "gptq" and "lm_head" not in keep:
        keep.append("lm_head")  # vLLM's GPTQ path quantizes the head only with lm_head: true; GPTQ keeps it
    if group_size not in GROUP_SIZES:
        raise ConversionError(f"--group-size {group_size} is not one of {GROUP_SIZES}")
    if not src.is_dir():
        raise ConversionError(f"source {src} is not a directory")
    if dst.exists():
        raise ConversionError(f"destination {dst} exists; choose a new path or remove it first")
    if dst.resolve().is_relative_to(src.resolve()):
        raise ConversionError(f"destination {dst} is inside the source {src}; choose a path outside it")
    cfg_path = src / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise ConversionError(f"{cfg_path} is missing; the source must be a Hugging Face checkpoint") from None
    except (ValueError, OSError) as e:
        raise ConversionError(f"{cfg_path} is not a readable JSON file: {e}") from e
    if not isinstance(config, dict):
        raise ConversionError(f"{cfg_path} is not a JSON object; the source must be a Hugging Face checkpoint")
    if "quantization_config" in config:  # C18: null, a non-dict, or another method: one line, exit 2
        qc = config["quantization_config"]
        method = qc.get("quant_method") if isinstance(qc, dict) else None
        raise ConversionError(
            f"{cfg_path}: quantization_config is {json.dumps(qc) if not isinstance(qc, dict) else 'present'}"
            f" (quant_method {method!r}): {src} is already quantized or its config is damaged; "
            "convert a bf16/fp16/fp32 checkpoint whose config.json has no quantization_config")
    names = _tensor_inventory(src, config)  # before anything is written
    tied = bool(config.get("tie_word_embeddings", False))
    try:
        structure = model_structure(src, config)
    except StructureError as e:
        raise ConversionError(str(e)) from e
    keep, problems = structure.expand_keep(keep)
    if problems:
        raise ConversionError("; ".join(problems))
    if structure.head_is_embedding and "lm_head" not in keep:
        keep.append("lm_head")  # vLLM computes its logits with the embedding: the tie stays, in bf16

    created = [p for p in (dst.parent, *dst.parent.parents) if not p.exists()]  # ours to remove on failure
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    except OSError as e:
        raise ConversionError(f"cannot create the output beside {dst}: {e}") from e
    try:
        reports: list[TensorReport] = []
        per_module: dict[str, int] = {}
        writer = ShardWriter(tmp)
        has_head = "lm_head.weight" in names
        modules = {n.rsplit(".", 1)[0] for n in names} | {"lm_head"}
        short = {m.split(".")[-1] for m in modules}
        unknown = [k for k in keep if k not in modules and k not in short]
        if unknown:
            raise ConversionError(f"--keep-bf16 {' '.join(unknown)} matches no module of {src} "
                                  f"(e.g. {', '.join(sorted(short)[:8])})")
        if not tied and not has_head:
            raise ConversionError(
                f"{src}: config.json says tie_word_embeddings is false but the checkpoint has no "
                "lm_head.weight; the output head is missing (a truncated or mislabelled checkpoint)")
        quantize_head = "lm_head" not in keep
        head_importance, head_importance_how = (None, "none: the head is not quantized")
        if not weighted_head:
            head_importance_how = "none: weighted_head=False"
        elif quantize_head and fmt == "cpu_int4":
            try:
                head_importance, head_importance_how = head_input_importance(src)
            except CalibrationError as e:
                raise ConversionError(str(e)) from e

        def emit_quantized(module: str, w: torch.Tensor, source_name: str) -> None:
            if w.dtype not in FLOAT_DTYPES:
                raise ConversionError(f"{source_name}: dtype {w.dtype} is not supported (bf16, fp16, fp32)")
            if w.dim() != 2:
                raise ConversionError(f"{source_name}: expected a 2-D weight, got shape {tuple(w.shape)}")
            if not bool(torch.isfinite(w).all()):
                raise ConversionError(f"{source_name}: holds NaN or infinite values; the checkpoint is damaged "
                                      "(re-download it, or convert the checkpoint it was made from)")
            try:
                g = choose_group_size(w.shape[1], group_size, module)
            except GroupSizeError as e:
                raise ConversionError(str(e)) from e
            if fmt == "gptq":
                if g != group_size or w.shape[0] % 8:
                    raise ConversionError(f"{source_name}: shape {tuple(w.shape)} does not fit GPTQ's single group "
                                          f"size {group_size} (and N % 8); choose a --group-size dividing every K")
                qs, ss = quantize_sym(w, g)
                for suffix, t in pack_gptq(qs, ss, g).items():
                    writer.add(f"{module}.{suffix}", t)
                db = sqnr_db(w, dequantize_sym(qs, ss))
                per_module[module] = g
                out_bytes = qs.numel() // 2 + ss.numel() * 2 * 2 + w.shape[1] * 4
                reports.append(TensorReport(source_name, list(w.shape), "quantized", g, round(db, 2),
                                            w.numel() * w.element_size(), out_bytes))
                return
            imp = head_importance if module == "lm_head" else None
            if imp is not None and imp.numel() != w.shape[1]:
                raise ConversionError(f"{source_name}: the head's input has {imp.numel()} channels in the model "
                                      f"transformers builds, the tensor {w.shape[1]}; the checkpoint is inconsistent")
            db, out_bytes = write_quantized(writer, module, w, g, imp)
            per_module[module] = g
            label = source_name if source_name == f"{module}.weight" else f"{module}.weight <- {source_name}"
            reports.append(TensorReport(label, list(w.shape), "quantized", g, round(db, 2),
                                        w.numel() * w.element_size(), out_bytes))

        for name, path in sorted(names.items()):
            with safe_open(str(path), framework="pt") as f:
                try:
                    t = f.get_tensor(name)
                except (SafetensorError, OSError, ValueError) as e:
                    raise ConversionError(f"{path}: tensor {name} cannot be read: {e}") from e
            module = name.rsplit(".", 1)[0]
            if name == "lm_head.weight" and tied and not quantize_head:
                continue  # tied and kept in bf16: vLLM ties it to the embedding
            quantizable = name.endswith(".weight") and (module in structure.linear or module == "lm_head")
            if quantizable and module.split(".")[-1] not in keep and module not in keep:
                emit_quantized(module, t, name)
            else:
                if t.is_floating_point() and t.dtype not in FLOAT_DTYPES:
                    raise ConversionError(f"{name}: dtype {t.dtype} is not supported (bf16, fp16, fp32)")
                writer.add(name, t)
                nbytes = t.numel() * t.element_size()
                reports.append(TensorReport(name, list(t.shape), "copied", None, None, nbytes, nbytes))
            del t
        if tied and quantize_head and not has_head:
            embed = next((n for n in names if n.endswith("embed_tokens.weight")), None)
            if embed is None:
                raise ConversionError(f"{src}: tied config but no embed_tokens.weight to build lm_head from")
            with safe_open(str(names[embed]), framework="pt") as f:
                emit_quantized("lm_head", f.get_tensor(embed), embed)
        writer.finish()

        out_config = dict(config)
        if tied and quantize_head:
            out_config["tie_word_embeddings"] = False
        out_config["quantization_config"] = {
            "quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": True,
            "lm_head": False, "checkpoint_format": "gptq", "converter_version": CONVERTER_VERSION,
        } if fmt == "gptq" else cpu_int4_config(group_size, keep, per_module, structure)
        (tmp / "config.json").write_text(json.dumps(out_config, indent=2) + "\n")
        for item in src.iterdir():
            if item.is_file() and item.name.startswith(COPIED_FILE_PREFIXES):
                shutil.copy2(item, tmp / item.name)
        write_report(tmp, reports, source=str(src), group_size=group_size, keep_bf16=keep,
                     architecture=structure.architecture, head_importance=head_importance_how,
                     tied_head={"source_tied": tied, "head_quantized": quantize_head,
                                "why_not": (f"vLLM's {structure.architecture} computes the logits with the input "
                                            "embedding" if structure.head_is_embedding else
                                            "--keep-bf16 lm_head" if not quantize_head else None)})
        publish(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in created:  # innermost first; only directories this call made, and only if empty
            try:
                p.rmdir()
            except OSError:
                break
        raise
    return reports
