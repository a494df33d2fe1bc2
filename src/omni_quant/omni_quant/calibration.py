"""What the output head sees: per-input-channel importance from a short calibration text.

The output head turns the final hidden state into the logits that pick every token, and its
input, the final norm's output, is far from uniform: a few channels carry most of the energy.
:func:`head_input_importance` runs the bf16 model once over :data:`CALIBRATION_TEXT`
(transformers, CPU) and returns E[x_k^2] per input channel of the head, which
:func:`omni_quant.quant_math.quantize` uses to weight each channel's rounding error (the
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

logger = logging.getLogger("omni_quant.calibration")

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
                            tokenizer_dir: str | Path | None = None) -> tuple[dict[str, torch.Tensor] | None, str]:
    """E[x_k^2] of every linear layer's input over :data:`CALIBRATION_TEXT`, from the bf16 model at ``src``.

    Returns ``(importance, how)``: ``importance`` maps each ``torch.nn.Linear`` of the model as
    transformers builds it, by module name (the checkpoint's names, e.g.
    ``model.layers.0.mlp.down_proj``; the output head also as ``"lm_head"``), to float32 ``[in_features]``;
    None when the model cannot run here (no tokenizer in ``src``, or transformers cannot build it).
    ``how`` is one line for the quantization report (token count, or why there is none). Loads the
    whole model in bf16 once (about 2 bytes per parameter of RAM) and runs one forward per text, on CPU.
    With ``gguf_file`` (a file in the directory ``src``), the model and tokenizer are transformers'
    reading of that llama.cpp file, every tensor dequantized (``GgufConfig(dequantize=True)``).
    ``config`` (a transformers config already read from ``src``) and ``tokenizer_dir`` (a directory
    holding that model's tokenizer files) spare transformers reading them again: each reading of a
    GGUF file parses all its metadata, the vocabulary included (seconds on two cores).

    Raises:
        CalibrationError: transformers refuses a tensor whose shape contradicts ``config.json``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
        return None, f"none: transformers cannot build the model (RuntimeError: {str(e)[:120]})"
    except (OSError, ValueError, TypeError, KeyError) as e:
        return None, f"none: transformers cannot build the model ({type(e).__name__}: {str(e)[:120]})"
    try:
        if tokenizer_dir is not None:
            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        else:
            tok = AutoTokenizer.from_pretrained(str(src), **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError, TypeError) as e:
        return None, f"none: no tokenizer in {src} ({type(e).__name__})"
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

    from omni_quant.structure import checkpoint_names

    names = checkpoint_names(model)  # the checkpoint's module names (GPT-NeoX: embed_out, not lm_head)
    hooks = [m.register_forward_pre_hook(grab(names[name])) for name, m in model.named_modules()
             if name and (isinstance(m, torch.nn.Linear) or m is head)]
    head_name = next((names[name] for name, m in model.named_modules() if m is head and name), "lm_head")
    try:
        with torch.inference_mode():
            for text in CALIBRATION_TEXT:
                ids = tok(text, return_tensors="pt")["input_ids"]
                if ids.numel():
                    model(input_ids=ids, logits_to_keep=0)
    except Exception as e:  # the weighting is an improvement, never a reason to fail a conversion
        return None, f"none: the calibration forward failed ({type(e).__name__}: {str(e)[:120]})"
    finally:
        for h in hooks:
            h.remove()
    count = counts.get(head_name, 0)
    if count < MIN_TOKENS:  # e.g. a tokenizer transformers builds from the config alone, with no vocabulary
        return None, (f"none: the tokenizer of {src} turns the calibration text into {count} tokens "
                      f"(fewer than {MIN_TOKENS}: no usable tokenizer)")
    importance = {name: total / counts[name] for name, total in sums.items()}
    del model
    how = (f"E[x^2] per input channel of {len(importance)} linear layers over {count} calibration tokens "
           "(omni_quant.calibration)")
    logger.info("omni-quant: input importance of %d linear layers from %d calibration tokens", len(importance), count)
    importance["lm_head"] = importance[head_name]  # the head by its generic name too (GPT-NeoX: embed_out)
    return importance, how
