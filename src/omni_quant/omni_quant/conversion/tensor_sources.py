"""One checkpoint tensor at a time, by name: what the layer-by-layer calibration reads its weights from.

Two sources, each holding nothing in memory but the tensor it is asked for:

- :class:`SafetensorsSource`: a Hugging Face checkpoint's ``*.safetensors`` files; each read opens
  the file, copies the one tensor out and closes it (``safetensors.safe_open``), so no mapping of the
  file stays in the process.
- :class:`GgufSource`: a llama.cpp GGUF file; each read copies the tensor's bytes with ``os.pread``
  (not through ``GGUFReader``'s memory map, whose touched pages would stay in the resident set until
  the reader is dropped), dequantizes them with the ``gguf`` package and applies transformers'
  tensor processor (llama.cpp's q/k row permutation undone), as transformers' own
  ``load_gguf_checkpoint`` does (transformers 5.25, ``modeling_gguf_pytorch_utils.py``).
"""

from __future__ import annotations

import json
import mmap
import os
import re
from pathlib import Path

import numpy as np
import torch

from omni_quant.conversion.output import ConversionError

__all__ = ["DEQUANTIZE_ROWS", "LAYER", "GgufSource", "SafetensorsSource", "dequantize_rows", "gguf_tensor_bytes",
           "release_mapped_pages", "return_freed_heap", "tensor_inventory"]

DEQUANTIZE_ROWS = 2048
"""Rows :func:`dequantize_rows` hands the ``gguf`` package at a time."""


class SafetensorsSource:
    """Tensors of a safetensors checkpoint by name, read one by one.

    ``files`` maps each tensor name to the file holding it (:func:`tensor_inventory`)."""

    def __init__(self, files: dict[str, Path]):
        self.files = dict(files)

    def names(self) -> set[str]:
        """Every tensor name the checkpoint holds."""
        return set(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of ``name``, read from the file's header only."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            return tuple(f.get_slice(name).get_shape())

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor ``name`` in its stored shape, a private copy, as stored or cast to ``dtype``.

        Raises:
            KeyError: no such tensor; safetensors' own errors for an unreadable file."""
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            t = f.get_tensor(name)
        return t if dtype is None else t.to(dtype)


def gguf_tensor_bytes(fd: int, tensor) -> np.ndarray:
    """The stored data of a ``gguf.ReaderTensor`` read from the open file ``fd`` with ``os.pread``, shaped and
    typed as ``tensor.data`` (quantized types: uint8 ``[rows, bytes per row]``), without touching the reader's
    memory map (its pages would count in the process's resident set while the reader lives).

    Raises:
        OSError: the file is shorter than the tensor's extent (a truncated file)."""
    n, at = int(tensor.n_bytes), int(tensor.data_offset)
    raw = os.pread(fd, n, at)
    if len(raw) != n:
        raise OSError(f"tensor {tensor.name}: {len(raw)} of {n} bytes at offset {at} (the file is truncated)")
    return np.frombuffer(raw, dtype=tensor.data.dtype).reshape(tensor.data.shape)


def dequantize_rows(data: np.ndarray, qtype, out_dtype=np.float32) -> np.ndarray:
    """``gguf.dequantize`` of a tensor's stored ``data`` (a quantized type: uint8 ``[rows, bytes per row]``),
    :data:`DEQUANTIZE_ROWS` rows at a time, into one writable ``out_dtype`` array ``[rows, columns]``.

    The ``gguf`` package's numpy dequantization holds several temporaries of the whole input (for ``Q6_K``
    about 5 GB beside a 151936 x 1536 output head, measured on Qwen2.5-Coder-1.5B: a 9.3 GB peak); rows are
    independent blocks, so the result is the same, bounded by a chunk's temporaries.

    Raises:
        NotImplementedError: a type the ``gguf`` package cannot dequantize."""
    from gguf import dequantize

    if data.ndim < 2 or data.shape[0] <= DEQUANTIZE_ROWS:
        return np.array(dequantize(data, qtype), dtype=out_dtype)  # a copy: the stored data may be mapped
    first = dequantize(data[:DEQUANTIZE_ROWS], qtype)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=out_dtype)
    out[:DEQUANTIZE_ROWS] = first
    for a in range(DEQUANTIZE_ROWS, data.shape[0], DEQUANTIZE_ROWS):
        out[a:a + DEQUANTIZE_ROWS] = dequantize(data[a:a + DEQUANTIZE_ROWS], qtype)
    return out


def return_freed_heap() -> None:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``). Chunked dequantization
    and per-layer weights free tens of MB at a time that glibc keeps for reuse, fragmented: the resident set
    of a Qwen2.5-Coder-1.5B conversion grew by 1.8 GB over the layer walk without it. A no-op without glibc."""
    import ctypes
    import ctypes.util

    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        _libc = ctypes.CDLL(name) if name else False
    if _libc and hasattr(_libc, "malloc_trim"):
        _libc.malloc_trim(0)


_libc = None


def release_mapped_pages(reader) -> None:
    """Take the pages of the GGUF file that ``reader`` (a ``gguf.GGUFReader``, whose ``data`` is a read-only
    ``np.memmap`` of the whole file) has touched out of this process's resident set: ``madvise(MADV_DONTNEED)``
    on the mapping. A converter that reads every tensor through the map would otherwise end holding the whole
    file (1.1 GB for Qwen2.5-Coder-1.5B Q4_K_M) as resident file pages. The mapping is shared and read-only, so
    nothing is lost: the pages stay in the page cache, and a later read (an array still viewing the map
    included) faults them back in. A no-op where the map or ``MADV_DONTNEED`` is not there."""
    base = getattr(getattr(reader, "data", None), "base", None)
    if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)


class GgufSource:
    """Tensors of a GGUF file by their transformers name, each dequantized to float32 when read.

    ``reader`` is the file's ``gguf.GGUFReader``; ``name_map`` maps GGUF tensor names to transformers'
    parameter names (``get_gguf_hf_weights_map``); ``processor`` is transformers' tensor processor for the
    model (``TENSOR_PROCESSORS``). Only processors that keep each tensor's name are supported (MoE
    processors merge experts across tensors): :meth:`names` is empty otherwise, so the caller falls back."""

    def __init__(self, path: str | os.PathLike[str], reader, name_map: dict[str, str], processor):
        self.path = Path(path)
        self.processor = processor
        self.by_hf = {hf: t for t in reader.tensors if (hf := name_map.get(t.name)) is not None}

    def names(self) -> set[str]:
        """Every transformers parameter name the file provides."""
        return set(self.by_hf)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of ``name`` as transformers holds it (GGUF stores dimensions innermost first)."""
        return tuple(int(d) for d in reversed(self.by_hf[name].shape))

    def _keeps_values(self, gguf_name: str) -> bool:
        """Whether transformers' processor returns this tensor as dequantized (its base ``TensorProcessor``;
        ``LlamaTensorProcessor`` but for the q/k rows it reorders), so it may be converted a chunk at a time."""
        from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor

        kind = type(self.processor)
        return kind is TensorProcessor or (kind is LlamaTensorProcessor and ".attn_q." not in gguf_name
                                           and ".attn_k." not in gguf_name)

    def get(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The tensor ``name`` dequantized (:func:`dequantize_rows`), in transformers' layout, cast to ``dtype``.

        Raises:
            KeyError: no such tensor; NotImplementedError: a type the ``gguf`` package cannot dequantize;
            OSError: a truncated file."""
        t = self.by_hf[name]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = gguf_tensor_bytes(fd, t)
        finally:
            os.close(fd)
        if data.ndim == 2 and self._keeps_values(t.name):  # row by row into ``dtype``: no float32 copy
            from gguf import dequantize

            out = torch.empty(self.shape(name), dtype=dtype)
            for a in range(0, data.shape[0], DEQUANTIZE_ROWS):
                out[a:a + DEQUANTIZE_ROWS] = torch.from_numpy(
                    np.asarray(dequantize(data[a:a + DEQUANTIZE_ROWS], t.tensor_type), dtype=np.float32)).to(dtype)
            return out
        values = self.processor.process(dequantize_rows(data, t.tensor_type), t.name).weights
        del data
        if not values.flags.writeable or values.dtype != np.float32:
            values = np.array(values, dtype=np.float32)
        return torch.from_numpy(values).reshape(self.shape(name)).to(dtype)


def tensor_inventory(src: Path, config: dict) -> dict[str, Path]:
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
        present = {int(m.group(1)) for m in map(LAYER.search, names) if m}
        missing = sorted(set(range(n_layers)) - present)
        if missing:
            raise ConversionError(
                f"{src}: config.json says num_hidden_layers={n_layers} but the checkpoint has no tensor of "
                f"layer(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}; a truncated checkpoint: {fix}")
    return names


LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
