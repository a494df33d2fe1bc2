"""Test helper: a GGUF writer that starts as a copy of another file's metadata (the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path


def writer_like(src: Path, dst: Path):
    """``(reader of src, writer to dst)``: the writer holds every metadata field of ``src`` (its
    architecture included) and no tensor yet; the caller adds tensors and writes the file."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    return reader, writer
