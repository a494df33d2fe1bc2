"""The checkpoint converter: a bf16/fp16/fp32 Hugging Face checkpoint of any architecture vLLM serves
to cpu_int4.

What is quantized is read from the model's structure (:mod:`omni_quant.conversion.structure`: the linear
layers transformers builds for it, on the meta device), not from its architecture's name: the
input embedding stays a lookup and everything else is copied. ``--keep-bf16`` takes checkpoint
names (``q_proj``) or vLLM's fused names (``qkv_proj``, all its members); keeping part of a
fused layer is refused with its partners named.

Streams tensor by tensor (``safetensors.safe_open``; output written in shards of at
most ``SHARD_BYTES``), so peak memory is bounded by one shard plus the largest tensor,
not by the model. Writes into a temporary directory beside ``DST`` and renames it only
when complete: a failure leaves nothing at ``DST``.

The input embedding is quantized by the recipe (format_version 4, :mod:`omni_quant.conversion.embedding`):
vLLM looks its rows up in the stored form (:mod:`omni_quant.runtime.embedding`). ``--keep-bf16 embed_tokens`` keeps
it in bf16, as do a kept tied head, GPTQ output and models whose logits are the embedding's.

Tied embeddings (C04): when the output head is tied to the input embedding and not
named in ``keep_bf16``, the converter writes a quantized ``lm_head`` (made from the
embedding, or from ``lm_head.weight`` when the checkpoint also carries one) beside the
quantized embedding table used for lookups, and sets ``tie_word_embeddings: false``. With
``keep_bf16=["lm_head"]`` the tie is kept, and the head and the embedding stay one bf16 table.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from omni_quant.conversion import embedding as embedding_convert
from omni_quant.conversion.calibration import CalibrationError, linear_input_importance
from omni_quant.conversion.gptq import dequantize_sym, pack_gptq, quantize_sym
from omni_quant.conversion.output import (
    CONVERTER_VERSION,
    ConversionError,
    ShardWriter,
    TensorReport,
    cpu_int4_config,
    discard,
    out_of_space,
    partial_dir,
    publish,
    write_int8,
    write_quantized,
    write_quantized_super_blocks,
    write_report,
)
from omni_quant.conversion.recipes import DEFAULT_RECIPE, Recipe, recipe_named
from omni_quant.conversion.structure import ModelStructure, StructureError, model_structure
from omni_quant.conversion.tensor_sources import tensor_inventory
from omni_quant.format import super_blocks
from omni_quant.format.quant_math import (
    GROUP_SIZES,
    GroupSizeError,
    choose_group_size,
    sqnr_db,
)

logger = logging.getLogger("omni_quant.conversion.checkpoint")

__all__ = ["DEFAULT_GROUP_SIZE", "FORMATS", "convert"]

DEFAULT_GROUP_SIZE = 32
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
COPIED_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "generation_config", "chat_template", "vocab",
                        "merges", "added_tokens")
"""Non-weight files of the source carried over (tokenizer and generation settings)."""

DAMAGED = "the checkpoint is damaged (re-download it, or convert the checkpoint it was made from)"


FORMATS = ("cpu_int4", "gptq")


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], group_size: int = DEFAULT_GROUP_SIZE,
            keep_bf16: list[str] | None = None, fmt: str = "cpu_int4",
            recipe: str = DEFAULT_RECIPE) -> list[TensorReport]:
    """Convert ``src`` to a cpu_int4 checkpoint at ``dst``; returns the per-tensor report.

    ``recipe`` (:data:`omni_quant.conversion.recipes.RECIPES`): the default makes every linear layer 4-bit at
    ``group_size`` (32: 5.0 bits per weight with the bf16 scale and zero of each group), each
    layer's rounding weighted by what its input carries
    (:func:`omni_quant.conversion.calibration.linear_input_importance`; skipped, and the report says why, when
    the model cannot run here); ``q4`` leaves rounding unweighted, ``q4-head8`` makes the output head
    8-bit, ``q8`` every linear. The measured fidelity of each: docs/cpu_int4.md, the recipe table,
    each row from its artifact.

    ``fmt="gptq"`` writes stock vLLM's GPTQ format instead (:mod:`omni_quant.conversion.gptq`: symmetric
    round to nearest, one group size for every layer, the output head kept in bf16 as GPTQ
    checkpoints do): the baseline omni is compared with, not an omni format.

    Raises:
        ConversionError: missing or corrupt input, an architecture vLLM does not serve, an
            unsupported dtype, a weight whose shape ``config.json`` contradicts, an existing ``dst``,
            an untied config without ``lm_head.weight``,
            a keep list naming part of a fused layer, a K no supported group size divides, an
            unknown recipe or one ``fmt="gptq"`` cannot hold. ``dst`` does not exist afterwards then.
    """
    src, dst = Path(src), Path(dst)
    keep = _check_request(src, dst, fmt, group_size, keep_bf16)
    try:
        chosen = recipe_named(recipe)
    except ValueError as e:
        raise ConversionError(str(e)) from None
    if fmt == "gptq" and (chosen.body_bits, chosen.head_bits) != (4, 4):
        raise ConversionError(f"--recipe {recipe} keeps tensors at 8 bits; --format gptq holds 4-bit layers only")
    if fmt == "gptq" and chosen.super_blocks:
        raise ConversionError(f"--recipe {recipe} writes super-blocks, which only --format cpu_int4 holds")
    config = _read_config(src)
    names = tensor_inventory(src, config)  # before anything is written
    plan = _plan(src, config, names, keep, fmt)
    tmp, created = partial_dir(dst)
    try:
        importance, importance_how = _importance(src, fmt, chosen)
        writer = ShardWriter(tmp)
        reports, embedding = _write_tensors(writer, plan, names, fmt, group_size, chosen, importance)
        writer.finish()
        _write_config(tmp, config, plan, fmt, group_size, chosen, reports, embedding)
        _copy_side_files(src, tmp)
        write_report(tmp, reports, source=str(src), recipe=chosen.name, group_size=group_size, keep_bf16=plan.keep,
                     architecture=plan.structure.architecture, importance=importance_how,
                     tied_head=plan.tied_head_report(),
                     embedding=embedding_convert.report(embedding, plan.embedding_kept))
        publish(tmp, dst)
    except BaseException as exc:
        discard(tmp, created)
        full = out_of_space(exc, dst, sum(f.stat().st_size for f in set(names.values())))
        if full is not None:
            raise full from None
        raise
    return reports


def _check_request(src: Path, dst: Path, fmt: str, group_size: int, keep_bf16: list[str] | None) -> list[str]:
    """The arguments on their own: format, group size, source and destination paths; the keep list.

    Raises:
        ConversionError: an unknown format or group size, no source directory, an existing
            ``dst`` or one inside ``src``."""
    keep = list(keep_bf16 or [])
    if fmt not in FORMATS:
        raise ConversionError(f"--format {fmt} is not one of {FORMATS}")
    if fmt == "gptq" and "lm_head" not in keep:
        keep.append("lm_head")  # vLLM's GPTQ path quantizes the head only with lm_head: true; GPTQ keeps it
    if group_size not in GROUP_SIZES:
        raise ConversionError(f"--group-size {group_size} is not one of {GROUP_SIZES}")
    if not src.exists():
        raise ConversionError(f"source {src} does not exist")
    if not src.is_dir():
        raise ConversionError(f"source {src} is a file but neither a checkpoint directory nor a GGUF file")
    if dst.exists():
        raise ConversionError(f"destination {dst} exists; choose a new path or remove it first")
    if dst.resolve().is_relative_to(src.resolve()):
        raise ConversionError(f"destination {dst} is inside the source {src}; choose a path outside it")
    return keep


def _read_config(src: Path) -> dict:
    """``src/config.json`` as a dict, refusing an already quantized checkpoint (C18).

    Raises:
        ConversionError: missing, unreadable or not an object; holds a ``quantization_config``."""
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
    return config


@dataclass
class _Plan:
    """What the conversion will do, decided before anything is written."""

    src: Path
    structure: ModelStructure
    keep: list[str]  # expanded keep list (fused partners, lm_head when it stays bf16)
    tied: bool  # config.json's tie_word_embeddings
    has_head: bool  # the checkpoint carries lm_head.weight
    quantize_head: bool
    embedding_kept: str | None = None  # why the input embedding stays bf16; None: quantized

    def quantizes(self, name: str) -> bool:
        """Whether checkpoint tensor ``name`` is the weight of a linear layer the recipe quantizes."""
        module = name.rsplit(".", 1)[0]
        linear = name.endswith(".weight") and (module in self.structure.linear or module == "lm_head")
        return linear and module.split(".")[-1] not in self.keep and module not in self.keep

    def tied_head_report(self) -> dict:
        """The report's ``tied_head`` entry: was the head tied, is it quantized, and if not why."""
        why = (f"vLLM's {self.structure.architecture} computes the logits with the input embedding"
               if self.structure.head_is_embedding else "--keep-bf16 lm_head" if not self.quantize_head else None)
        return {"source_tied": self.tied, "head_quantized": self.quantize_head, "why_not": why}


def _plan(src: Path, config: dict, names: dict[str, Path], keep: list[str], fmt: str = "cpu_int4") -> _Plan:
    """Read the model's structure and settle the keep list and the output head.

    Raises:
        ConversionError: an architecture vLLM cannot build, a keep list naming part of a fused
            layer or no module, an untied config without ``lm_head.weight``."""
    try:
        structure = model_structure(src, config)
    except StructureError as e:
        raise ConversionError(str(e)) from e
    keep, problems = structure.expand_keep(keep)
    if problems:
        raise ConversionError("; ".join(problems))
    emb = structure.input_embedding
    emb_names = {*embedding_convert.KEEP_NAMES, *((emb, emb.rsplit(".", 1)[-1]) if emb else ())}
    keep_embedding = [k for k in keep if k in emb_names]
    keep = [k for k in keep if k not in emb_names]
    if structure.head_is_embedding and "lm_head" not in keep:
        keep.append("lm_head")  # vLLM computes its logits with the embedding: the tie stays, in bf16
    head = structure.head  # "lm_head" in a keep list means the head, whatever the checkpoint calls it
    if head != "lm_head" and (head in keep) != ("lm_head" in keep):
        keep.append(head if "lm_head" in keep else "lm_head")
    # only what the converter would quantize can be kept: norms, biases and the input embedding stay bf16 anyway
    modules = {n.rsplit(".", 1)[0] for n in names}
    linear = {m for m in modules if m in structure.linear} | {"lm_head", head}
    short = {m.split(".")[-1] for m in linear} | set(structure.fused)
    unknown = [k for k in keep if k not in linear and k not in short]
    if unknown:
        example = next((m for m in sorted(structure.linear) if ".0." in m), next(iter(sorted(linear))))
        others = [k for k in unknown if k in modules or k in {m.split(".")[-1] for m in modules}]
        why = (f"; {' '.join(others)} {'is' if len(others) == 1 else 'are'} not a linear layer (norms, biases and "
               "the input embedding are never quantized)") if others else ""
        raise ConversionError(f"--keep-bf16 {' '.join(unknown)} matches no linear layer of {src}{why}. Name a "
                              f"linear layer by its short name ({', '.join(sorted(short)[:8])}) or its full "
                              f"checkpoint name (e.g. {example})")
    tied, has_head = bool(config.get("tie_word_embeddings", False)), f"{head}.weight" in names
    if not tied and not has_head:
        raise ConversionError(
            f"{src}: config.json says tie_word_embeddings is false but the checkpoint has no "
            f"{head}.weight; the output head is missing (a truncated or mislabelled checkpoint)")
    quantize_head = "lm_head" not in keep
    kept = embedding_convert.why_kept(structure, keep_embedding, tied and not quantize_head, fmt)
    return _Plan(src, structure, keep + keep_embedding, tied, has_head, quantize_head, kept)


def _importance(src: Path, fmt: str, recipe: Recipe) -> tuple[dict[str, torch.Tensor], str]:
    """Per-input-channel importance ``[K]`` by module name for the recipe's weighted rounding, and the
    report's one line on where it came from (or why there is none).

    Raises:
        ConversionError: the calibration model contradicts the checkpoint (:class:`CalibrationError`)."""
    if fmt != "cpu_int4":
        return {}, f"none: --format {fmt} rounds to nearest"
    if not recipe.weighted:
        return {}, f"none: recipe {recipe.name} rounds unweighted"
    try:
        found, how = linear_input_importance(src)
    except CalibrationError as e:
        raise ConversionError(str(e)) from e
    return found or {}, how


def _write_tensors(writer: ShardWriter, plan: _Plan, names: dict[str, Path], fmt: str, group_size: int,
                   recipe: Recipe, importance: dict[str, torch.Tensor]
                   ) -> tuple[list[TensorReport], embedding_convert.Written | None]:
    """Every tensor of the checkpoint, in name order, quantized or copied into ``writer`` (the input
    embedding by :func:`omni_quant.conversion.embedding.from_float` unless ``plan.embedding_kept``); then the
    quantized ``lm_head`` of a tied model, built from its embedding. Returns the report rows and the
    quantized embedding (None: bf16).

    Raises:
        ConversionError: an unreadable tensor, an unsupported dtype, a NaN/inf or non-2-D weight,
            a K no group size divides, a group whose range no float scale holds (magnitudes
            near the float32 maximum), a shape GPTQ's format cannot hold, a linear weight whose shape
            is not the one ``config.json`` gives it."""
    from safetensors import SafetensorError, safe_open

    reports: list[TensorReport] = []
    embedding = None
    emb = plan.structure.input_embedding
    for name, path in sorted(names.items()):
        with safe_open(str(path), framework="pt") as f:
            try:
                t = f.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as e:
                raise ConversionError(f"{path}: tensor {name} cannot be read: {e}") from e
        if name == f"{plan.structure.head}.weight" and plan.tied and not plan.quantize_head:
            continue  # tied and kept in bf16: vLLM ties it to the embedding
        module = name.rsplit(".", 1)[0]
        if emb is not None and name == f"{emb}.weight" and plan.embedding_kept is None:
            embedding = _quantize_embedding(writer, module, t, name, recipe, group_size)
            if embedding is not None:
                reports.append(TensorReport(name, list(t.shape), embedding.action, None, embedding.sqnr_db,
                                            t.numel() * t.element_size(), embedding.bytes_out, embedding.bits))
                del t
                continue
            plan.embedding_kept = f"no scheme holds D={t.shape[1]} (a multiple of 32 is needed)"
        if plan.quantizes(name):
            _check_shape(t, name, plan.structure.shapes.get(module), plan.structure.architecture)
            reports.append(_quantize_one(writer, module, t, name, fmt, group_size, recipe, importance.get(module),
                                         plan.structure.head))
        else:
            if t.is_floating_point() and t.dtype not in FLOAT_DTYPES:
                raise ConversionError(f"{name}: dtype {t.dtype} is not supported (bf16, fp16, fp32)")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ConversionError(f"{name}: holds NaN or infinite values; {DAMAGED}")
            writer.add(name, t)
            nbytes = t.numel() * t.element_size()
            reports.append(TensorReport(name, list(t.shape), "copied", None, None, nbytes, nbytes))
        del t
    if plan.tied and plan.quantize_head and not plan.has_head:
        embed = next((n for n in names if n.endswith("embed_tokens.weight")), None)
        if embed is None:
            raise ConversionError(f"{plan.src}: tied config but no embed_tokens.weight to build lm_head from")
        with safe_open(str(names[embed]), framework="pt") as f:
            w = f.get_tensor(embed)
        _check_shape(w, embed, plan.structure.shapes.get("lm_head"), plan.structure.architecture)
        reports.append(_quantize_one(writer, "lm_head", w, embed, fmt, group_size, recipe, importance.get("lm_head")))
    return reports, embedding


def _quantize_embedding(writer: ShardWriter, module: str, w: torch.Tensor, name: str, recipe: Recipe,
                        group_size: int) -> embedding_convert.Written | None:
    """The input embedding ``w`` ``[V, D]`` by the recipe's width (:func:`omni_quant.conversion.embedding.from_float`).

    Raises:
        ConversionError: an unsupported dtype, NaN or inf, a range no scale holds."""
    if w.dtype not in FLOAT_DTYPES or w.dim() != 2:
        raise ConversionError(f"{name}: dtype {w.dtype}, shape {tuple(w.shape)}: expected a 2-D bf16, fp16 or fp32 "
                              "embedding table")
    if not bool(torch.isfinite(w).all()):
        raise ConversionError(f"{name}: holds NaN or infinite values; {DAMAGED}")
    try:
        return embedding_convert.from_float(writer, module, w, recipe.body_bits, recipe.super_blocks, group_size)
    except ValueError as e:
        raise ConversionError(f"{name}: {e} (--keep-bf16 {module.rsplit('.', 1)[-1]})") from None


def _check_shape(w: torch.Tensor, source_name: str, expected: tuple[int, int] | None, arch: str) -> None:
    """Refuse a linear weight whose shape is not the ``[out_features, in_features]`` that transformers
    builds for this ``config.json`` (``expected``; None: not known, nothing to check). Every recipe and
    format reaches this, not only the calibrated default, whose model would also refuse it.

    Raises:
        ConversionError: naming the tensor, both shapes and the likely causes."""
    if expected is None or w.dim() != 2 or tuple(w.shape) == tuple(expected):
        return
    transposed = tuple(w.shape) == tuple(reversed(expected))
    raise ConversionError(
        f"{source_name}: shape {tuple(w.shape)}, but {arch} built from this config.json has it as "
        f"{tuple(expected)} (out_features, in_features)" + ("; it is transposed" if transposed else "") +
        "; the checkpoint does not match its config.json (a tensor from another model size, or a wrong "
        "hidden_size / intermediate_size / vocab_size)")


def _quantize_one(writer: ShardWriter, module: str, w: torch.Tensor, source_name: str, fmt: str,
                  group_size: int, recipe: Recipe, importance: torch.Tensor | None,
                  head: str = "lm_head") -> TensorReport:
    """Quantize one weight ``[N, K]`` (float) of ``module`` into ``writer`` in ``fmt`` at the recipe's
    width for it; its report row.

    Raises:
        ConversionError: see :func:`_write_tensors`."""
    if w.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"{source_name}: dtype {w.dtype} is not supported (bf16, fp16, fp32)")
    if w.dim() != 2:
        raise ConversionError(f"{source_name}: expected a 2-D weight, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ConversionError(f"{source_name}: holds NaN or infinite values; {DAMAGED}")
    bytes_in = w.numel() * w.element_size()
    label = source_name if source_name == f"{module}.weight" else f"{module}.weight <- {source_name}"
    if fmt == "cpu_int4" and recipe.bits_for(module, head) == 8:
        db, out_bytes = write_int8(writer, module, w)
        return TensorReport(label, list(w.shape), "quantized", w.shape[1], round(db, 2), bytes_in, out_bytes, 8)
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
        out_bytes = qs.numel() // 2 + ss.numel() * 2 * 2 + w.shape[1] * 4
        return TensorReport(source_name, list(w.shape), "quantized", g, round(sqnr_db(w, dequantize_sym(qs, ss)), 2),
                            bytes_in, out_bytes, 4)
    if importance is not None and importance.numel() != w.shape[1]:
        raise ConversionError(f"{source_name}: the layer's input has {importance.numel()} channels in the model "
                              f"transformers builds, the tensor {w.shape[1]}; the checkpoint is inconsistent")
    if recipe.super_blocks and super_blocks.fits(w.shape[1]):
        try:
            db, out_bytes = write_quantized_super_blocks(writer, module, w, importance)
        except ValueError as e:
            raise ConversionError(f"{source_name}: {e} (--keep-bf16 {module})") from None
        return TensorReport(label, list(w.shape), "quantized in super-blocks", super_blocks.SUB_BLOCK, round(db, 2),
                            bytes_in, out_bytes, 4)
    try:
        db, out_bytes = write_quantized(writer, module, w, g, importance)
    except ValueError as e:  # a range no float scale holds (quantize's own check)
        raise ConversionError(f"{source_name}: {e} (--keep-bf16 {module})") from None
    return TensorReport(label, list(w.shape), "quantized", g, round(db, 2), bytes_in, out_bytes, 4)


def _write_config(tmp: Path, config: dict, plan: _Plan, fmt: str, group_size: int, recipe: Recipe,
                  reports: list[TensorReport], embedding: embedding_convert.Written | None = None) -> None:
    """``config.json`` of the output: the source's, untied when the head was quantized, with the
    ``quantization_config`` of ``fmt`` (each quantized module's group size and width from its report row)."""
    skip = embedding.module if embedding is not None else None
    quantized = {_module_of(r.name): r for r in reports if r.bits is not None and _module_of(r.name) != skip}
    per_module = {m: r.group_size for m, r in quantized.items() if r.bits == 4}
    bits8 = [m for m, r in quantized.items() if r.bits == 8]
    sb = [m for m, r in quantized.items() if "super-blocks" in r.action]
    out = dict(config)
    if plan.tied and plan.quantize_head:
        out["tie_word_embeddings"] = False
    out["quantization_config"] = {
        "quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": True,
        "lm_head": False, "checkpoint_format": "gptq", "converter_version": CONVERTER_VERSION,
    } if fmt == "gptq" else cpu_int4_config(group_size, plan.keep, per_module, plan.structure, bits8,
                                            recipe.name, sb, embedding_convert.config_fields(embedding) or None)
    (tmp / "config.json").write_text(json.dumps(out, indent=2) + "\n")


def _module_of(report_name: str) -> str:
    """The module a report row's tensor belongs to (``lm_head.weight <- model.embed_tokens.weight``: ``lm_head``)."""
    return report_name.split(" <- ")[0].rsplit(".", 1)[0]


def _copy_side_files(src: Path, tmp: Path) -> None:
    """The tokenizer and generation files of ``src`` (:data:`COPIED_FILE_PREFIXES`), unchanged."""
    for item in src.iterdir():
        if item.is_file() and item.name.startswith(COPIED_FILE_PREFIXES):
            shutil.copy2(item, tmp / item.name)


