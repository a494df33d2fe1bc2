"""Reading a llama.cpp GGUF file as transformers reads it: the ``gguf`` package's reader with a clear error for
a damaged file, one metadata field, and each GGUF tensor name's transformers name (with transformers' tensor
processor for the model). Used by the GGUF converter (:mod:`.gguf_file`) and the calibration that reads the
same file (:mod:`.calibration`)."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from omni_quant.conversion.output import ConversionError

__all__ = ["field", "name_map", "one_metadata_parse", "open_reader"]


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
        return _reader_class()(str(path))
    except Exception as exc:  # noqa: BLE001  (a damaged file fails in many ways inside the reader)
        raise ConversionError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); "
                              "is it complete (compare its size and digest with the source)?") from exc


@functools.cache
def _reader_class() -> type:
    """``gguf.GGUFReader`` with its element read (``_get``) slicing a plain ``np.ndarray`` view of the file's map
    instead of the ``np.memmap`` itself; the stock class when ``_get``'s signature is not the one this was written
    against (gguf 0.19, ``gguf/gguf_reader.py``).

    The reader builds every metadata field one element at a time: SmolLM2's vocabulary and merges are about
    245,000 ``_get`` calls, each slicing the memmap, whose ``__getitem__`` and ``__array_finalize__`` run in
    Python (about 2.7 s of a 2.7 s parse on a 2-core EPYC; 0.8 s with plain views, one run each). The arrays read
    are the same bytes, dtypes and byte order; they are views of the same map (not memmaps), so dropping the
    map's pages (:func:`omni_quant.conversion.tensor_sources.release_mapped_pages`, on ``reader.data``) still
    covers them."""
    import inspect

    from gguf.gguf_reader import GGUFReader

    if list(inspect.signature(GGUFReader._get).parameters) != ["self", "offset", "dtype", "count", "override_order"]:
        return GGUFReader

    class PlainViewReader(GGUFReader):
        def _get(self, offset: int, dtype, count: int = 1, override_order=None) -> np.ndarray:
            plain = self.__dict__.get("_plain")
            if plain is None:  # the base __init__ maps the file and reads through _get at once
                plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
            dtype, count = np.dtype(dtype), int(count)
            arr = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return PlainViewReader


def field(reader, key: str):
    """The value of metadata ``key`` (a str for a byte string, else a list or a number), None when absent."""
    entry = reader.fields.get(key)
    if entry is None or not entry.data:
        return None
    value = entry.parts[entry.data[0]]
    return bytes(value).decode("utf-8") if value.dtype == np.uint8 else value.tolist()


def name_map(cfg) -> tuple[dict[str, str], object]:
    """GGUF tensor name -> transformers name, and transformers' tensor processor for this model.

    transformers' ``get_gguf_hf_weights_map`` (``modeling_gguf_pytorch_utils.py``, transformers 5.25) recurses over
    every module and builds gguf's ``TensorNameMap`` for the whole model at each one (397 times for SmolLM2-135M,
    most of a conversion's seconds by cProfile); the map depends only on the architecture and the block count,
    so it is built once here (``gguf.get_tensor_name_map``, which that function imports at each call, memoized
    for the duration of this call)."""
    import gguf
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    processor = TENSOR_PROCESSORS.get(cfg.model_type, TensorProcessor)(config=cfg.to_dict())
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        return get_gguf_hf_weights_map(model, processor), processor
    finally:
        gguf.get_tensor_name_map = original


@contextlib.contextmanager
def one_metadata_parse(path: Path | None = None, reader=None) -> Iterator[None]:
    """Within the block, transformers parses a GGUF file's metadata once: ``AutoConfig`` and ``AutoTokenizer``
    with ``gguf_file`` each call ``load_gguf_checkpoint(path, return_tensors=False)`` (``configuration_utils.py``,
    ``models/auto/tokenization_auto.py``, transformers 5.25, imported at each call), and each call reads every
    metadata field, the vocabulary and merges included, through gguf's ``GGUFReader``. Later calls get a deep copy
    of the first result, so that no caller's edits reach another. Calls with tensors are not cached. ``reader``
    (this module's :func:`open_reader` of ``path``, already parsed) is what that first call reads ``path`` with:
    ``load_gguf_checkpoint`` imports ``gguf.GGUFReader`` at each call and only reads the reader."""
    import gguf
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.load_gguf_checkpoint
    original_reader = gguf.GGUFReader
    seen: dict[str, dict] = {}

    def reuse(p, *args, **kwargs):
        if reader is not None and path is not None and not args and not kwargs \
                and Path(p).resolve() == Path(path).resolve():
            return reader
        return original_reader(p, *args, **kwargs)

    def once(gguf_checkpoint_path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return original(gguf_checkpoint_path, return_tensors, *args, **kwargs)
        key = str(gguf_checkpoint_path)
        if key not in seen:
            seen[key] = original(gguf_checkpoint_path, return_tensors=False)
        return copy.deepcopy(seen[key])

    gguf_utils.load_gguf_checkpoint = once
    gguf.GGUFReader = reuse
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = original
        gguf.GGUFReader = original_reader
