"""``omni-quant convert FILE.gguf DST``: a llama.cpp GGUF file straight to cpu_int4.

The config and the tokenizer come from the file as transformers reads them (``gguf_file=``), with
the file's chat template kept (transformers 5 drops ``tokenizer.chat_template`` on the way: put
back from the GGUF's metadata). Tensors are matched to the checkpoint names transformers uses
(``get_gguf_hf_weights_map`` on the model built on the meta device) and then, per tensor:

- a linear layer whose K is a multiple of 256 is stored in **super-blocks** (Q4_K's arrangement,
  :mod:`omni_quant.format.super_blocks`), unless a member of its vLLM fused layer is ``Q4_0``/``Q4_1``:
  a ``Q4_K`` tensor is **repacked** bit for bit (codes, six-bit scales and mins, float16 ``d`` and
  ``dmin``), any other type is dequantized and **requantized** into super-blocks;
- the other linear layers are per group of 32: ``Q4_0``, ``Q4_1`` and ``Q4_K`` **repacked**, their
  4-bit codes kept bit for bit (:mod:`omni_quant.format.gguf_blocks`; the scales and zeros rounded to
  bf16), any other type (``Q5_x``, ``Q6_K``, ``Q8_0``, ``F16``, ...) dequantized with the ``gguf``
  package and **requantized** to 4 bits at group size 32;
- requantization uses the default recipe's weighted rounding, the calibration run on transformers'
  dequantized reading of the same file. llama.cpp's row permutation of Llama's q/k projections is
  undone on codes and constants alike (transformers' ``LlamaTensorProcessor``), which keeps them exact;
- the input embedding (``token_embd``) keeps the file's type where cpu_int4 holds it (``Q4_K`` in
  super-blocks, ``Q4_0``/``Q4_1`` per group, ``Q8_0`` 8-bit, bit for bit), any other type is requantized
  to 8 bits per group of 32 (:mod:`omni_quant.conversion.embedding`); ``keep_embedding`` copies it in bf16;
- everything else (norms, biases) is dequantized and **copied** in bf16.

``quantization_report.json`` says which path each tensor took and its GGUF type.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from omni_quant.conversion import embedding as embedding_convert
from omni_quant.conversion.gguf_reading import field, open_reader
from omni_quant.conversion.gguf_reading import name_map as gguf_name_map
from omni_quant.conversion.output import ConversionError
from omni_quant.conversion.tensor_sources import dequantize_rows, release_mapped_pages, return_freed_heap
from omni_quant.format import super_blocks
from omni_quant.format.gguf_blocks import EXACT_TYPES, GROUP, stored_values_finite, to_cpu_int4

__all__ = ["GGUF_GROUP_SIZE", "convert_gguf"]

GGUF_GROUP_SIZE = GROUP


def _hf_side(path: Path, reader, out: Path) -> tuple[dict, object]:
    """Write config.json and the tokenizer files transformers makes of the GGUF into ``out``;
    return the config dict and the transformers config."""
    from transformers import AutoConfig, AutoTokenizer

    from omni_quant.conversion.gguf_reading import one_metadata_parse

    try:
        with one_metadata_parse(path, reader):
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001
        raise ConversionError(f"transformers cannot read the model in {path} ({type(exc).__name__}: {exc}); "
                              f"its architecture is {field(reader, 'general.architecture')!r}") from exc
    template = field(reader, "tokenizer.chat_template")
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    if not getattr(cfg, "architectures", None):  # a GGUF names its model type, not the class
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type)
        if cls is None:
            raise ConversionError(f"{path}: transformers has no causal LM for model type {cfg.model_type!r}")
        cfg.architectures = [cls]
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return json.loads((out / "config.json").read_text()), cfg


def _importance(path: Path, cfg, tokenizer_dir: Path, reader, name_map: dict[str, str],
                processor) -> tuple[dict[str, torch.Tensor], str]:
    """E[x^2] of every linear layer's input, from transformers' dequantized reading of the file: the
    default recipe's weighting for the tensors this path requantizes (:mod:`omni_quant.conversion.calibration`),
    one decoder layer dequantized at a time (:class:`omni_quant.conversion.tensor_sources.GgufSource` on ``reader``,
    ``name_map`` and ``processor``, :func:`_name_map`'s). ``cfg`` and the tokenizer in ``tokenizer_dir`` are
    :func:`_hf_side`'s, so the file's metadata is not parsed twice more.

    Raises:
        ConversionError: the file's model contradicts its own metadata (:class:`CalibrationError`)."""
    from omni_quant.conversion.calibration import CalibrationError, linear_input_importance
    from omni_quant.conversion.tensor_sources import GgufSource

    try:
        found, how = linear_input_importance(path.parent, gguf_file=path.name, config=cfg, tokenizer_dir=tokenizer_dir,
                                             source=GgufSource(path, reader, name_map, processor))
    except CalibrationError as e:
        raise ConversionError(str(e)) from e
    return found or {}, how


def _fits(importance: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor | None:
    """``importance`` when it is one value per input channel of ``w`` ``[N, K]``, else None (unweighted)."""
    return importance if importance is not None and importance.numel() == w.shape[1] else None


DAMAGED = "the file is damaged (re-download it, or convert the checkpoint it was made from)"


def _requantize(writer, module: str, w: torch.Tensor, importance: dict[str, torch.Tensor],
                what: str, in_super_blocks: bool = False) -> tuple[float, int]:
    """:func:`omni_quant.conversion.checkpoint.write_quantized` at group size 32, or in super-blocks (SQNR dB, bytes
    written), its ``ValueError`` (a range no float scale holds) as a ConversionError naming ``what``."""
    from omni_quant.conversion.output import write_quantized, write_quantized_super_blocks

    try:
        if in_super_blocks:
            return write_quantized_super_blocks(writer, module, w, _fits(importance.get(module), w))
        return write_quantized(writer, module, w, GROUP, _fits(importance.get(module), w))
    except ValueError as e:
        raise ConversionError(f"{what}: {e}") from None


PER_GROUP_TYPES = ("Q4_0", "Q4_1")
"""GGUF types whose exact form is per group of 32: a fused layer holding one stays per group."""


def _super_block_modules(reader, name_map: dict[str, str], structure) -> set[str]:
    """The linear modules the GGUF path stores in super-blocks: K a multiple of 256, and no member of
    the module's vLLM fused layer (``structure.fused``) stored as a per-group type."""
    kinds, cols = {}, {}
    for t in reader.tensors:
        hf = name_map.get(t.name)
        if hf and hf.endswith(".weight") and len(t.shape) == 2:
            module = hf.rsplit(".", 1)[0]
            kinds[module], cols[module] = t.tensor_type.name, int(t.shape[0])
    chosen = set()
    for module, k in cols.items():
        if not (module in structure.linear or module == "lm_head") or not super_blocks.fits(k):
            continue
        parent, _, short = module.rpartition(".")
        members = structure.partners(short) or (short,)
        if not any(kinds.get(f"{parent}.{m}" if parent else m) in PER_GROUP_TYPES for m in members):
            chosen.add(module)
    return chosen


def convert_gguf(gguf_file: str | os.PathLike[str], dst: str | os.PathLike[str], keep_embedding: bool = False) -> list:
    """Convert the GGUF ``gguf_file`` to a cpu_int4 checkpoint at ``dst``; return the per-tensor report.
    ``keep_embedding`` (``--keep-bf16 embed_tokens``) copies the input embedding in bf16 instead of keeping
    its stored type.

    Raises:
        ConversionError: the file is missing, damaged or of an architecture transformers or vLLM
            cannot build; a tensor of an unknown type; an existing ``dst``. Nothing is left at
            ``dst`` (nor any directory this call made) then.
    """
    from gguf import GGMLQuantizationType
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor

    from omni_quant.conversion.output import (
        ShardWriter,
        TensorReport,
        cpu_int4_config,
        discard,
        out_of_space,
        partial_dir,
        publish,
        write_codes,
        write_report,
        write_super_blocks,
    )
    from omni_quant.conversion.structure import StructureError, model_structure

    path, dst = Path(gguf_file), Path(dst)
    if not path.is_file():
        raise ConversionError(f"GGUF file {path} does not exist")
    if dst.exists():
        raise ConversionError(f"destination {dst} exists; choose a new path or remove it first")
    reader = open_reader(path)
    unchecked = set()  # tensors of a type whose stored bytes say nothing; checked once dequantized
    for t in reader.tensors:  # first: calibration would blame the layer where a NaN first shows
        release_mapped_pages(reader)  # the file's pages read so far leave the resident set (tensor_sources)
        finite = stored_values_finite(np.asarray(t.data), t.tensor_type.name)
        if finite is False:
            raise ConversionError(f"{path}: tensor {t.name} ({t.tensor_type.name}) holds NaN or infinite "
                                  f"values; {DAMAGED}")
        if finite is None:
            unchecked.add(t.name)
    tmp, created = partial_dir(dst)
    try:
        config, cfg = _hf_side(path, reader, tmp)
        try:
            structure = model_structure(tmp, config)
        except StructureError as e:
            raise ConversionError(str(e)) from e
        name_map, processor = gguf_name_map(cfg)
        exact_ok = type(processor) in (TensorProcessor, LlamaTensorProcessor)
        importance, importance_how = _importance(path, cfg, tmp, reader, name_map, processor)
        writer, reports, per_module = ShardWriter(tmp), [], {}
        in_sb = _super_block_modules(reader, name_map, structure) if exact_ok else set()
        tied = not any(t.name == "output.weight" for t in reader.tensors)
        head_from = None
        keep_names = list(embedding_convert.KEEP_NAMES) if keep_embedding else []
        emb_kept = embedding_convert.why_kept(structure, keep_names, tied and structure.head_is_embedding)
        emb_weight = f"{structure.input_embedding}.weight" if structure.input_embedding else None
        embedding = None
        for t in reader.tensors:
            release_mapped_pages(reader)  # the previous tensor's file pages leave the resident set
            return_freed_heap()
            hf = name_map.get(t.name)
            if hf is None:
                raise ConversionError(f"{path}: tensor {t.name} ({t.tensor_type.name}) has no counterpart in "
                                      f"transformers' {cfg.model_type} model; not a model this converter knows")
            kind = GGMLQuantizationType(t.tensor_type).name
            module = hf.rsplit(".", 1)[0]
            rows, cols = (int(t.shape[1]), int(t.shape[0])) if len(t.shape) == 2 else (None, None)
            linear = hf.endswith(".weight") and (module in structure.linear or module == "lm_head")
            if linear and module in in_sb and kind == "Q4_K":
                parts = super_blocks.from_q4_k(np.asarray(t.data), rows, cols)  # d, dmin checked above
                parts = [processor.process(a, t.name).weights for a in parts]  # llama q/k rows
                out_bytes = write_super_blocks(writer, module,
                                               *(torch.from_numpy(np.ascontiguousarray(a)) for a in parts))
                per_module[module] = GROUP
                reports.append(TensorReport(f"{hf} <- {t.name}", [rows, cols], f"repacked from {kind} in super-blocks",
                                            GROUP, None, int(t.n_bytes), out_bytes, 4))
                continue
            if linear and module not in in_sb and kind in EXACT_TYPES and exact_ok and cols % GROUP == 0:
                codes, s, z = to_cpu_int4(np.asarray(t.data), kind, rows, cols)  # scales checked above
                codes, s, z = (processor.process(a, t.name).weights for a in (codes, s, z))  # llama q/k rows
                out_bytes = write_codes(writer, module,
                                        *(torch.from_numpy(np.ascontiguousarray(a)) for a in (codes, s, z)))
                per_module[module] = GROUP
                reports.append(TensorReport(f"{hf} <- {t.name}", [rows, cols], f"repacked from {kind}", GROUP, None,
                                            int(t.n_bytes), out_bytes, 4))
                continue

            def values_of(t=t, kind=kind) -> np.ndarray:
                try:
                    values = dequantize_rows(np.asarray(t.data), t.tensor_type)  # bounded temporaries
                except NotImplementedError as e:
                    raise ConversionError(f"{path}: tensor {t.name} is {kind}, which the gguf package cannot "
                                          f"dequantize ({e})") from e
                values = processor.process(np.asarray(values, dtype=np.float32), t.name).weights
                if t.name in unchecked and not np.isfinite(values).all():
                    raise ConversionError(f"{path}: tensor {t.name} ({kind}) holds NaN or infinite values; "
                                          f"{DAMAGED}")
                return values

            if hf == emb_weight and emb_kept is None and rows:
                try:  # the exact types need transformers' plain reading of the tensor (exact_ok)
                    embedding = embedding_convert.from_gguf(writer, module, np.asarray(t.data), kind, rows, cols,
                                                            values_of, exact=exact_ok)
                except ValueError as e:
                    raise ConversionError(f"{path}: tensor {t.name} ({kind}): {e}") from None
                if embedding is not None:
                    reports.append(TensorReport(f"{hf} <- {t.name}", [rows, cols], embedding.action, None,
                                                embedding.sqnr_db, int(t.n_bytes), embedding.bytes_out,
                                                embedding.bits))
                    if tied:
                        head_from = torch.from_numpy(np.array(values_of(), dtype=np.float32)).to(torch.bfloat16)
                    continue
                emb_kept = f"{kind} with D={cols} (not a multiple of 32): no scheme holds it"
            values = values_of()
            if not values.flags.writeable or values.dtype != np.float32:
                values = np.array(values, dtype=np.float32)  # a copy: the file is mapped read-only, torch warns
            w = torch.from_numpy(values).to(torch.bfloat16)
            del values  # the float32 values go before the bf16 ones are quantized (Qwen2.5-Coder's head: 933 MB)
            if linear:
                sb = module in in_sb
                db, out_bytes = _requantize(writer, module, w, importance, f"{path}: tensor {t.name}", sb)
                per_module[module] = GROUP
                reports.append(TensorReport(f"{hf} <- {t.name}", list(w.shape),
                                            f"requantized from {kind}" + (" in super-blocks" if sb else ""), GROUP,
                                            round(db, 2), int(t.n_bytes), out_bytes, 4))
            else:
                writer.add(hf, w)
                reports.append(TensorReport(f"{hf} <- {t.name}", list(w.shape), f"copied from {kind}", None, None,
                                            int(t.n_bytes), w.numel() * 2))
                if tied and hf.endswith("embed_tokens.weight"):
                    head_from = w
        if tied and head_from is not None and not structure.head_is_embedding:
            sb = exact_ok and super_blocks.fits(head_from.shape[1])
            db, out_bytes = _requantize(writer, "lm_head", head_from, importance,
                                        f"{path}: token_embd.weight (tied head)", sb)
            per_module["lm_head"] = GROUP
            if sb:
                in_sb.add("lm_head")
            action = "requantized from the dequantized embedding" + (" in super-blocks" if sb else "")
            reports.append(TensorReport("lm_head.weight <- token_embd.weight (tied)", list(head_from.shape), action,
                                        GROUP, round(db, 2), 0, out_bytes, 4))
        writer.finish()
        keep = ["lm_head"] if tied and structure.head_is_embedding else []
        untie = tied and not structure.head_is_embedding
        if untie:
            config["tie_word_embeddings"] = False
        config["quantization_config"] = cpu_int4_config(GROUP, keep, per_module, structure, recipe="gguf",
                                                        super_block_modules=sorted(in_sb & set(per_module)),
                                                        embedding=embedding_convert.config_fields(embedding) or None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_report(tmp, reports, source=str(path), source_format="gguf", recipe="gguf", group_size=GROUP,
                     keep_bf16=keep + keep_names, importance=importance_how,
                     architecture=structure.architecture, embedding=embedding_convert.report(embedding, emb_kept),
                     paths={p: sum(r.action.startswith(p) for r in reports) for p in ("repacked", "requantized",
                                                                                        "copied", "embedding")})
        publish(tmp, dst)
    except BaseException as exc:
        discard(tmp, created)
        full = out_of_space(exc, dst, path.stat().st_size)
        if full is not None:
            raise full from None
        raise
    return reports
