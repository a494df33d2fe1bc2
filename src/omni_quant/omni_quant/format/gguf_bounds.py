"""A GGUF file's header checked against the file's own size before anything trusts it (C35).

The ``gguf`` package's ``GGUFReader`` (and transformers' GGUF loading, built on it) takes every length in the
header at its word: a metadata array declaring 2^62 elements makes it loop and allocate until memory runs out,
a tensor whose shape or offset points past the end fails late or maps garbage. :func:`check` walks the header as
the format defines it (llama.cpp ``docs/gguf.md``: magic ``GGUF``, version, tensor count, metadata count, the
metadata key/value pairs, then per tensor its name, dimensions, type and offset into the data section aligned
to ``general.alignment``) with every count and length bounded by the bytes left in the file, so a hostile or
truncated file is refused in one pass over its header: memory bounded by the longest string in it, time by the
header's size.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

__all__ = ["GgufBoundsError", "check"]

MAGIC = b"GGUF"
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of each fixed-size GGUF value type (uint8 .. float64, bool)."""
STRING, ARRAY = 8, 9
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32


class GgufBoundsError(ValueError):
    """The file's header declares something its size cannot hold; the message says what and where."""


class _Cursor:
    def __init__(self, f, size: int) -> None:
        self.f, self.size, self.pos = f, size, 0

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.left():
            raise GgufBoundsError(f"{what} needs {n} bytes at offset {self.pos}, but the file ends "
                                  f"{self.left()} bytes later")
        data = self.f.read(n)
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.left():
            raise GgufBoundsError(f"{what} needs {n} bytes at offset {self.pos}, but the file ends "
                                  f"{self.left()} bytes later")
        self.f.seek(n, os.SEEK_CUR)
        self.pos += n

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        return self.take(self.u64(f"{what}'s length"), what)


def _value(c: _Cursor, vtype: int, key: str, depth: int = 0) -> int | None:
    """Step over one value of ``vtype``; return it when it is an unsigned integer (``general.alignment``)."""
    if vtype in SCALAR_SIZES:
        raw = c.take(SCALAR_SIZES[vtype], f"the value of {key!r}")
        return int.from_bytes(raw, "little") if vtype in (4, 10) else None
    if vtype == STRING:
        c.skip(c.u64(f"the length of {key!r}'s string"), f"{key!r}'s string")
        return None
    if vtype == ARRAY:
        if depth > 2:
            raise GgufBoundsError(f"metadata {key!r}: arrays nested more than 3 deep")
        etype, count = c.u32(f"{key!r}'s array type"), c.u64(f"{key!r}'s array length")
        least = SCALAR_SIZES.get(etype, 8 if etype == STRING else 12 if etype == ARRAY else None)
        if least is None:
            raise GgufBoundsError(f"metadata {key!r}: an array of unknown value type {etype}")
        if count * least > c.left():
            raise GgufBoundsError(f"metadata {key!r} declares an array of {count} elements of type {etype} "
                                  f"(at least {count * least} bytes), but {c.left()} bytes of the file are left")
        if etype in SCALAR_SIZES:
            c.skip(count * least, f"{key!r}'s array")
        else:
            for _ in range(count):
                _value(c, etype, key, depth + 1)
        return None
    raise GgufBoundsError(f"metadata {key!r} has unknown value type {vtype}")


def check(path: str | os.PathLike[str]) -> int:
    """Check ``path``'s GGUF header against its size; return how many tensors it declares.

    Raises:
        GgufBoundsError: not a GGUF file, a count, length, shape or offset the file cannot hold, or a tensor of a
            type the ``gguf`` package does not know; the message names the key or tensor.
        OSError: the file cannot be read.
    """
    from gguf import GGML_QUANT_SIZES

    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        c = _Cursor(f, size)
        if c.take(4, "the magic") != MAGIC:
            raise GgufBoundsError("it does not start with the GGUF magic bytes")
        version = c.u32("the version")
        if version not in (2, 3):
            raise GgufBoundsError(f"GGUF version {version} (this reader knows 2 and 3)")
        n_tensors, n_kv = c.u64("the tensor count"), c.u64("the metadata count")
        # each metadata pair needs at least 8 + 4 + 1 bytes, each tensor 8 + 4 + 8 + 4 + 8
        if n_kv * 13 > c.left() or n_tensors * 32 > c.left():
            raise GgufBoundsError(f"it declares {n_kv} metadata pairs and {n_tensors} tensors, more than its "
                                  f"{size} bytes can hold")
        alignment = DEFAULT_ALIGNMENT
        for i in range(n_kv):
            key = c.string(f"metadata key #{i}").decode("utf-8", "replace")
            value = _value(c, c.u32(f"{key!r}'s value type"), key)
            if key == "general.alignment" and value is not None:
                alignment = value
        if alignment <= 0 or alignment & (alignment - 1):
            raise GgufBoundsError(f"general.alignment is {alignment}, not a power of two")
        tensors = []
        for i in range(n_tensors):
            name = c.string(f"tensor #{i}'s name").decode("utf-8", "replace")
            n_dims = c.u32(f"tensor {name!r}'s dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GgufBoundsError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
            dims = [c.u64(f"tensor {name!r}'s dimensions") for _ in range(n_dims)]
            qtype, offset = c.u32(f"tensor {name!r}'s type"), c.u64(f"tensor {name!r}'s offset")
            if qtype not in {int(t) for t in GGML_QUANT_SIZES}:
                raise GgufBoundsError(f"tensor {name!r} has unknown type {qtype}")
            tensors.append((name, dims, qtype, offset))
        data_start = -(-c.pos // alignment) * alignment
        data_size = size - data_start
        sizes = {int(t): v for t, v in GGML_QUANT_SIZES.items()}
        for name, dims, qtype, offset in tensors:
            block, type_size = sizes[qtype]
            count = 1
            for d in dims:
                count *= d
            if count == 0 or count % block:
                raise GgufBoundsError(f"tensor {name!r} of shape {dims} is not a whole number of its type's "
                                      f"blocks of {block}")
            nbytes = count // block * type_size
            if offset + nbytes > data_size:
                raise GgufBoundsError(f"tensor {name!r} of shape {dims} needs {nbytes} bytes at data offset "
                                      f"{offset}, but the data section holds {max(data_size, 0)} bytes")
    return n_tensors
