"""Test helper: GGUF files made from another one (the ``gguf`` package): a writer that starts as a copy of a file's
metadata, and a copy that keeps only the first decoder blocks."""

from __future__ import annotations

from pathlib import Path


def writer_like(src: Path, dst: Path, overrides: dict | None = None):
    """``(reader of src, writer to dst)``: the writer holds every metadata field of ``src`` (its architecture
    included; a field named in ``overrides`` gets that value, of the field's type) and no tensor yet; the caller
    adds tensors (:func:`write_tensors`)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        value = (overrides or {}).get(field.name, field.contents())
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    return reader, writer


def write_tensors(writer, tensors: list) -> None:
    """Write ``tensors`` (``(name, raw numpy array, GGML type)`` each, as a reader holds them) and close the file."""
    for name, raw, kind in tensors:
        writer.add_tensor_info(name, raw.shape, raw.dtype, raw.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, raw, _ in tensors:
        writer.write_tensor_data(raw)
    writer.close()


def fewer_layers(src: Path, dst: Path, layers: int) -> Path:
    """A copy of the GGUF ``src`` at ``dst`` that keeps only its first ``layers`` decoder blocks (``blk.N.*``,
    ``<arch>.block_count`` set to match): the same tokenizer, embedding, head and tensor types, a model that
    converts and runs in a fraction of the time."""
    import gguf
    import numpy as np

    arch = bytes(gguf.GGUFReader(str(src)).fields["general.architecture"].parts[-1]).decode()
    reader, writer = writer_like(src, dst, {f"{arch}.block_count": layers})
    write_tensors(writer, [(t.name, np.asarray(t.data), t.tensor_type) for t in reader.tensors
                           if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < layers])
    return dst
