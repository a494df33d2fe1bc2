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


def fewer_layers(src: Path, dst: Path, layers: int) -> Path:
    """A copy of the GGUF ``src`` at ``dst`` that keeps only its first ``layers`` decoder blocks (``blk.N.*``,
    ``<arch>.block_count`` set to match): the same tokenizer, embedding, head and tensor types, a model that
    converts and runs in a fraction of the time."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(dst), arch)
    count_key = f"{arch}.block_count"
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == count_key:
            writer.add_key_value(count_key, layers, field.types[0])
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    kept = [(t.name, np.asarray(t.data), t.tensor_type) for t in reader.tensors
            if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers]
    for name, raw, kind in kept:
        writer.add_tensor_info(name, raw.shape, raw.dtype, raw.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, raw, _ in kept:
        writer.write_tensor_data(raw)
    writer.close()
    return dst
