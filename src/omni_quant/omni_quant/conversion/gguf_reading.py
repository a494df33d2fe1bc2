"""Reading a llama.cpp GGUF file as transformers reads it: the ``gguf`` package's reader with a clear error for
a damaged file, one metadata field, and each GGUF tensor name's transformers name (with transformers' tensor
processor for the model). Used by the GGUF converter (:mod:`.gguf_file`) and the calibration that reads the
same file (:mod:`.calibration`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from omni_quant.conversion.output import ConversionError

__all__ = ["field", "name_map", "open_reader"]


def open_reader(path: Path):
    """The ``gguf`` package's ``GGUFReader`` of ``path``, once its header was checked against the file's size
    (:func:`omni_quant.format.gguf_bounds.check`: the reader trusts every length in it, C35).

    Raises:
        ConversionError: the file is not a readable GGUF file, or its header declares what the file cannot hold
            (one line naming it; the message asks whether it is complete).
    """
    from omni_quant.format.gguf_bounds import GgufBoundsError, check

    try:
        check(path)
    except GgufBoundsError as exc:
        raise ConversionError(f"{path} is not a usable GGUF file: {exc}; is it complete (compare its size and "
                              "digest with the source)?") from None
    except OSError as exc:
        raise ConversionError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        from gguf import GGUFReader

        return GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001  (a damaged file fails in many ways inside the reader)
        raise ConversionError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
                              "is it complete (compare its size and digest with the source)?") from exc


def field(reader, key: str):
    """The value of metadata ``key`` (a str for a byte string, else a list or a number), None when absent."""
    entry = reader.fields.get(key)
    if entry is None or not entry.data:
        return None
    value = entry.parts[entry.data[0]]
    return bytes(value).decode("utf-8") if value.dtype == np.uint8 else value.tolist()


def name_map(cfg) -> tuple[dict[str, str], object]:
    """GGUF tensor name -> transformers name, and transformers' tensor processor for this model."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    processor = TENSOR_PROCESSORS.get(cfg.model_type, TensorProcessor)(config=cfg.to_dict())
    return get_gguf_hf_weights_map(model, processor), processor
