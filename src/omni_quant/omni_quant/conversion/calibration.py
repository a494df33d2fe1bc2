"""What the output head sees: per-input-channel importance from a short calibration text.

The output head turns the final hidden state into the logits that pick every token, and its
input, the final norm's output, is far from uniform: a few channels carry most of the energy.
:func:`linear_input_importance` runs the bf16 model over :data:`CALIBRATION_TEXT` (transformers,
CPU, one decoder layer in memory at a time: :mod:`omni_quant.conversion.streaming`) and returns E[x_k^2] per
input channel of every linear layer (:func:`head_input_importance`: of the head), which
:func:`omni_quant.format.quant_math.quantize` uses to weight each channel's rounding error (the
diagonal of llama.cpp's ``imatrix``; AWQ, Lin et al. 2023, scales by the same statistic).

The text is omni's own, mixed prose, code, dialogue and numbers, and shares nothing with
``harness/data/fidelity_prompts.json``, which measures the result.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

__all__ = ["CALIBRATION_TEXT", "MIN_TOKENS", "CalibrationError", "head_input_importance", "linear_input_importance"]


class CalibrationError(ValueError):
    """The checkpoint contradicts its own config (a tensor's shape), found while building the model."""

MIN_TOKENS = 64
"""Fewer calibration tokens than this: no usable tokenizer (a real one gives hundreds); no weighting."""

logger = logging.getLogger("omni_quant.conversion.calibration")

CALIBRATION_TEXT = [
    "The lighthouse keeper wrote in his log every evening: the wind from the north-west, the swell "
    "rising after dusk, two fishing boats returning late with their lamps lit. In winter the supply "
    "ship came once a month, and he counted the days by the oil left in the great lamp.",
    "def merge_intervals(intervals):\n    intervals.sort(key=lambda pair: pair[0])\n    merged = []\n"
    "    for start, end in intervals:\n        if merged and start <= merged[-1][1]:\n"
    "            merged[-1][1] = max(merged[-1][1], end)\n        else:\n            merged.append([start, end])\n"
    "    return merged\n",
    "Customer: Hi, my order arrived but the charger is missing.\nAgent: I'm sorry about that. Could "
    "you give me the order number?\nCustomer: It's 48-1170-36.\nAgent: Thanks. I've sent a "
    "replacement; it should arrive within three working days.",
    "Quarterly revenue rose 7.4% to 312 million euros, while operating costs fell from 205 to 198 "
    "million. The board proposed a dividend of 0.85 per share, payable on 14 May.",
    "SELECT city, COUNT(*) AS stations FROM weather_stations WHERE elevation_m > 1500 GROUP BY city "
    "ORDER BY stations DESC LIMIT 10;",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. The light reactions "
    "take place in the thylakoid membranes; the Calvin cycle fixes carbon in the stroma.",
    "La gare était presque vide. Un chat traversa le quai, puis le dernier train de la nuit partit "
    "vers la côte, lentement, sous la pluie.",
    "To replace a bicycle inner tube: release the brake, remove the wheel, lever one side of the tyre "
    "off the rim, pull out the old tube, check the tyre for thorns, then fit the new tube slightly "
    "inflated and work the tyre back on with your thumbs.",
]


def head_input_importance(src: str | Path) -> tuple[torch.Tensor | None, str]:
    """E[x_k^2] of the output head's input: :func:`linear_input_importance`'s ``"lm_head"`` entry.

    Returns ``(importance float32 [hidden_size] or None, how)``.

    Raises:
        CalibrationError: see :func:`linear_input_importance`.
    """
    found, how = linear_input_importance(src)
    return (found.get("lm_head") if found is not None else None), how


def linear_input_importance(src: str | Path, gguf_file: str | None = None, config=None,
                            tokenizer_dir: str | Path | None = None, source=None,
                            watch=None) -> tuple[dict[str, torch.Tensor] | None, str]:
    """E[x^2] of every linear layer's input over :data:`CALIBRATION_TEXT`, from the bf16 model at ``src``.

    Returns ``(importance, how)``: ``importance`` maps each ``torch.nn.Linear`` of the model as
    transformers builds it, by module name (the checkpoint's names, e.g.
    ``model.layers.0.mlp.down_proj``; the output head also as ``"lm_head"``), to float32 ``[in_features]``;
    None when the model cannot run here (no tokenizer in ``src``, or transformers cannot build it).
    ``how`` is one line for the quantization report (token count, or why there is none).

    The forward runs one decoder layer at a time (:func:`omni_quant.conversion.streaming.layerwise_input_sums`):
    resident are one layer's bf16 weights, the embedding while the texts are embedded, and the
    activations of the texts, never the model; the values are those of a whole-model forward in bf16
    (tests/test_streaming_calibration.py compares them). The weights are read from ``source``
    (:mod:`omni_quant.conversion.tensor_sources`), by default the safetensors files of ``src``, or with
    ``gguf_file`` (a file in the directory ``src``) that llama.cpp file, each tensor dequantized as
    transformers' GGUF reading does. A model the layer walk cannot feed by name (a fused MoE expert
    tensor) falls back to loading the whole model with transformers, logged and said in ``how``.
    ``config`` (a transformers config already read from ``src``) and ``tokenizer_dir`` (a directory
    holding that model's tokenizer files) spare transformers reading them again: each reading of a
    GGUF file parses all its metadata, the vocabulary included (seconds on two cores). ``watch(model)``
    is passed to the layer walk (tests count the weights materialized at once).

    Raises:
        CalibrationError: a tensor's shape contradicts ``config.json`` (checked before any tokenizer is read).
    """
    from omni_quant.conversion.streaming import NotLayerwise, layerwise_input_sums

    if config is None:
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(src), **({"gguf_file": gguf_file} if gguf_file else {}))
        except (OSError, ValueError, TypeError, KeyError) as e:
            return None, f"none: transformers cannot build the model ({type(e).__name__}: {str(e)[:120]})"
    not_layerwise = None
    try:
        if source is None:
            source = _default_source(Path(src), gguf_file, config)
        ids, how = _token_ids(src, gguf_file, tokenizer_dir)
        found = layerwise_input_sums(config, source, ids or [], watch=watch, shape_error=CalibrationError)
        if ids is None:
            return None, how
        sums, counts, head_name, stats = found
        where = f"one decoder layer at a time, {stats.layers} layers"
    except CalibrationError:
        raise
    except NotLayerwise as e:
        not_layerwise = e
    except Exception as e:  # the weighting is an improvement, never a reason to fail a conversion
        return None, f"none: the calibration forward failed ({type(e).__name__}: {str(e)[:120]})"
    if not_layerwise is not None:
        logger.warning("omni-quant: calibration loads the whole model (%s)", not_layerwise)
        try:
            sums, counts, head_name, how = _whole_model_sums(src, gguf_file, config, tokenizer_dir)
        except CalibrationError:
            raise
        except Exception as e:  # noqa: BLE001  (as above)
            return None, f"none: the calibration forward failed ({type(e).__name__}: {str(e)[:120]})"
        if sums is None:
            return None, how
        where = f"whole model in memory: {not_layerwise}"
    count = counts.get(head_name, 0)
    if count < MIN_TOKENS:  # e.g. a tokenizer transformers builds from the config alone, with no vocabulary
        return None, (f"none: the tokenizer of {src} turns the calibration text into {count} tokens "
                      f"(fewer than {MIN_TOKENS}: no usable tokenizer)")
    importance = {name: total / counts[name] for name, total in sums.items()}
    how = (f"E[x^2] per input channel of {len(importance)} linear layers over {count} calibration tokens "
           f"({where}; omni_quant.conversion.calibration)")
    logger.info("omni-quant: input importance of %d linear layers from %d calibration tokens", len(importance), count)
    importance["lm_head"] = importance[head_name]  # the head by its generic name too (GPT-NeoX: embed_out)
    return importance, how


def _default_source(src: Path, gguf_file: str | None, config):
    """The tensors of ``src``: its safetensors files, or the GGUF file ``src / gguf_file``.

    Raises:
        NotLayerwise: they cannot be listed by name (the caller loads the whole model instead)."""
    from omni_quant.conversion.streaming import NotLayerwise
    from omni_quant.conversion.tensor_sources import GgufSource, SafetensorsSource

    if gguf_file is not None:
        from omni_quant.conversion.gguf_reading import name_map as gguf_name_map
        from omni_quant.conversion.gguf_reading import open_reader

        name_map, processor = gguf_name_map(config)
        return GgufSource(src / gguf_file, open_reader(src / gguf_file), name_map, processor)
    from omni_quant.conversion.output import ConversionError
    from omni_quant.conversion.tensor_sources import tensor_inventory

    try:
        return SafetensorsSource(tensor_inventory(src, config.to_dict()))
    except ConversionError as e:
        raise NotLayerwise(str(e)) from e


def _token_ids(src, gguf_file: str | None, tokenizer_dir) -> tuple[list[torch.Tensor] | None, str]:
    """:data:`CALIBRATION_TEXT` as token ids (int64 ``[1, T]`` per non-empty text), or None and why not."""
    from transformers import AutoTokenizer

    try:
        if tokenizer_dir is not None:
            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        else:
            tok = AutoTokenizer.from_pretrained(str(src), **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError, TypeError) as e:
        return None, f"none: no tokenizer in {src} ({type(e).__name__})"
    ids = [tok(text, return_tensors="pt")["input_ids"] for text in CALIBRATION_TEXT]
    return [i for i in ids if i.numel()], ""


def _whole_model_sums(src, gguf_file: str | None, config, tokenizer_dir):
    """The calibration forward on the whole model loaded by transformers (bf16, about 2 bytes per
    parameter): the fallback for a model :mod:`omni_quant.conversion.streaming` cannot walk layer by layer, and the
    reference its tests compare with. Returns ``(sums, counts, head name, how)``, sums None with how
    saying why.

    Raises:
        CalibrationError: transformers refuses a tensor whose shape contradicts ``config.json``."""
    from transformers import AutoModelForCausalLM

    extra = {}
    if gguf_file is not None:
        from transformers import GgufConfig

        extra = {"gguf_file": gguf_file, "quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)}
    try:
        if config is not None:
            extra["config"] = config
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16, **extra)
    except RuntimeError as e:
        if "size mismatch" in str(e) or "ignore_mismatched_sizes" in str(e):
            first = next((ln.strip() for ln in str(e).splitlines() if "mismatch" in ln.lower()), str(e)[:200])
            raise CalibrationError(f"{src}: a tensor's shape contradicts config.json ({first[:200]}); "
                                   "the checkpoint is damaged or its config belongs to another model") from e
        return None, None, None, f"none: transformers cannot build the model (RuntimeError: {str(e)[:120]})"
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, None, None, f"none: transformers cannot build the model ({type(e).__name__}: {str(e)[:120]})"
    ids, how = _token_ids(src, gguf_file, tokenizer_dir)
    if ids is None:
        return None, None, None, how
    model.eval()
    head = model.get_output_embeddings()
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def grab(name):
        def hook(_module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + x.pow(2).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return hook

    from omni_quant.conversion.structure import checkpoint_names

    names = checkpoint_names(model)  # the checkpoint's module names (GPT-NeoX: embed_out, not lm_head)
    hooks = [m.register_forward_pre_hook(grab(names[name])) for name, m in model.named_modules()
             if name and (isinstance(m, torch.nn.Linear) or m is head)]
    head_name = next((names[name] for name, m in model.named_modules() if m is head and name), "lm_head")
    try:
        with torch.inference_mode():
            for one in ids:
                model(input_ids=one, logits_to_keep=0)
    finally:
        for h in hooks:
            h.remove()
    return sums, counts, head_name, ""
