"""Calibration one decoder layer at a time (omni_quant.conversion.streaming, issue 31 item 7): the same E[x^2] as a
whole-model transformers forward, with at most one decoder layer's weights materialized at once; the
GGUF source reads what transformers' own GGUF loading reads; a converted SmolLM2 serves in vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_architectures import ARCHS, SMALL
from test_convert import write_checkpoint

from conftest import clean_env, run_engine
from omni_quant.conversion.calibration import CALIBRATION_TEXT, linear_input_importance


def _with_tokenizer(ckpt: Path, real_model: Path) -> Path:
    """``ckpt`` with SmolLM2's tokenizer files (vocabulary 49152), so the calibration text tokenizes."""
    for stale in ckpt.glob("tokenizer*"):
        stale.unlink()
    for f in real_model.glob("*token*"):
        shutil.copy(f, ckpt / f.name)
    return ckpt


def _reference(src: Path, gguf_file: str | None = None) -> dict[str, torch.Tensor]:
    """E[x^2] per input channel of every linear layer and of the head, from a plain transformers forward
    of the whole model in bf16 (each text alone, as the calibration does), keyed by the checkpoint's module
    names (GPT-NeoX's head is ``embed_out`` there)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from omni_quant.conversion.structure import checkpoint_names

    extra = {"gguf_file": gguf_file, "quantization_config": GgufConfig(gguf_file=gguf_file, dequantize=True)} \
        if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16, **extra).eval()
    tok = AutoTokenizer.from_pretrained(str(src), **({"gguf_file": gguf_file} if gguf_file else {}))
    head = model.get_output_embeddings()
    sums, counts = {}, {}

    def grab(name):
        def hook(_m, args):
            x = args[0].float().reshape(-1, args[0].shape[-1])
            sums[name] = sums.get(name, 0) + x.pow(2).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]
        return hook

    saved = checkpoint_names(model)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) or m is head:
            m.register_forward_pre_hook(grab(saved[name]))
    with torch.inference_mode():
        for text in CALIBRATION_TEXT:
            model(input_ids=tok(text, return_tensors="pt")["input_ids"])
    return {k: v / counts[k] for k, v in sums.items()}


def _assert_same(found: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(found) - {"lm_head"} == set(want) - {"lm_head"}
    for name, ref in want.items():
        got = found[name]
        assert got.dtype == torch.float32 and got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=0, msg=name)


@pytest.mark.parametrize("tied", [True, False])
def test_layerwise_equals_a_whole_model_forward_on_a_tiny_llama(tmp_path, real_model, tied):
    src = _with_tokenizer(write_checkpoint(tmp_path / "src", hidden=64, inter=128, vocab=49152, layers=3,
                                           tied=tied, with_head=not tied), real_model)
    found, how = linear_input_importance(src)
    assert "one decoder layer at a time, 3 layers" in how, how
    _assert_same(found, _reference(src))
    assert len(found) == 3 * 7 + 1  # seven linears a layer and the head


def _tiny_qwen2(path: Path, real_model: Path) -> Path:
    """A random Qwen2 (q/k/v biases; every other layer a sliding-window layer) saved by transformers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=4, vocab_size=49152, tie_word_embeddings=False, use_sliding_window=True,
                      sliding_window=16, max_window_layers=2, max_position_embeddings=512)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)  # transformers initializes biases to zero: make them matter
    model.save_pretrained(str(path))
    return _with_tokenizer(path, real_model)


def test_layerwise_equals_a_whole_model_forward_on_a_tiny_qwen2_with_sliding_window_layers(tmp_path, real_model):
    src = _tiny_qwen2(tmp_path / "qwen2", real_model)
    found, how = linear_input_importance(src)
    assert "4 layers" in how, how
    _assert_same(found, _reference(src))


@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_layerwise_equals_a_whole_model_forward_on_every_architecture_of_the_any_model_test(tmp_path, real_model,
                                                                                            model_type):
    """tests/test_architectures.py's tiny checkpoints (a vocabulary the calibration text fits in): fused
    checkpoint tensors (phi3, gpt_neox), scaled embeddings (gemma), post-norms (olmo2), a head named
    ``embed_out`` (gpt_neox) all walk layer by layer, to the same values."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra, _ = ARCHS[model_type]
    cfg = AutoConfig.for_model(model_type, **{**SMALL, **extra, "vocab_size": 49152})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path / model_type)
    src = _with_tokenizer(tmp_path / model_type, real_model)
    found, how = linear_input_importance(src)
    assert "one decoder layer at a time, 2 layers" in how, how
    _assert_same(found, _reference(src))


def test_at_most_one_decoder_layer_is_materialized_at_once(tmp_path, real_model):
    """Counted through the walk's own hook: with layer i's weights in place, every other decoder layer's
    parameters are still on the meta device and the output head was never read."""
    src = _with_tokenizer(write_checkpoint(tmp_path / "src", hidden=64, inter=128, vocab=49152, layers=4,
                                           tied=False, with_head=True), real_model)
    seen = []

    def watch(model):
        layers = model.model.layers
        real = [i for i, layer in enumerate(layers) if any(p.device.type != "meta" for p in layer.parameters())]
        outside = sum(p.numel() for n, p in model.named_parameters()
                      if p.device.type != "meta" and not n.startswith("model.layers."))
        seen.append((real, outside, model.lm_head.weight.device.type, model.model.embed_tokens.weight.device.type))

    found, _ = linear_input_importance(src, watch=watch)
    assert [r for r, *_ in seen] == [[0], [1], [2], [3]]
    assert all(outside == 64 for _, outside, *_ in seen), "only the final norm (64) outside the layers"
    assert all(head == "meta" and embed == "meta" for *_, head, embed in seen)
    assert found["lm_head"].shape == (64,)


def test_a_norm_shaped_against_its_config_is_named_before_any_weight_is_read(tmp_path):
    from omni_quant.conversion.calibration import CalibrationError

    src = write_checkpoint(tmp_path / "src", extra={"model.norm.weight": torch.ones(127)})  # hidden is 128
    with pytest.raises(CalibrationError, match=r"model\.norm\.weight: stored shape \(127,\).*\(128,\).*contradicts"):
        linear_input_importance(src)


def test_the_gguf_source_gives_what_transformers_gguf_loading_gives(real_model):
    """SmolLM2's own GGUF (Q4_1, llama.cpp's q/k row order undone by transformers' processor): every tensor
    of the layer walk's source equals the state dict transformers dequantizes from the same file."""
    from gguf import GGUFReader
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from harness.models.registry import gguf_path
    from omni_quant.conversion.gguf_reading import name_map as _name_map
    from omni_quant.conversion.tensor_sources import GgufSource

    path = gguf_path("smollm2-135m")
    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    name_map, processor = _name_map(cfg)
    source = GgufSource(path, GGUFReader(str(path)), name_map, processor)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(cfg)
    want = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=empty)["tensors"]
    names = ["model.layers.4.self_attn.q_proj.weight", "model.layers.4.self_attn.k_proj.weight",
             "model.layers.4.mlp.down_proj.weight", "model.layers.4.input_layernorm.weight", "model.norm.weight",
             "model.embed_tokens.weight"]  # 49152 rows: converted 2048 rows at a time
    for name in names:
        assert source.shape(name) == tuple(want[name].shape), name
        assert torch.equal(source.get(name), want[name].float()), name
        assert torch.equal(source.get(name, torch.bfloat16), want[name].to(torch.bfloat16)), name


@pytest.mark.engine
def test_smollm2_converted_with_layerwise_calibration_serves_like_bf16(tmp_path, real_model):
    """End to end: `convert` of the real SmolLM2-135M calibrates one layer at a time (its report says so),
    and the 4-bit result, in a real vLLM engine, starts its greedy answers as the bf16 model does."""
    from omni_quant.conversion.checkpoint import convert

    dst = tmp_path / "int4"
    convert(real_model, dst)
    report = json.loads((dst / "quantization_report.json").read_text())
    assert "one decoder layer at a time, 30 layers" in report["importance"], report["importance"]
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "The three primary colors are",
               "To make a cup of tea,", "Photosynthesis is", "User: What is 2 + 2?\nAssistant:", "import numpy as np\n"]
    llm = {"enforce_eager": True, "max_num_seqs": 8, "max_model_len": 256}
    config = {"runs": [{"llm": {**llm, "model": str(real_model)}, "prompts": prompts, "max_tokens": 4},
                       {"llm": {**llm, "model": str(dst)}, "prompts": prompts, "max_tokens": 4}]}
    bf16, int4 = run_engine(config, clean_env(VLLM_PLUGINS="omni"))["runs"]
    same_first = sum(a[0] == b[0] for a, b in zip(bf16["token_ids"], int4["token_ids"], strict=True))
    assert same_first >= 6, (same_first, bf16["texts"], int4["texts"])


def test_sqnr_by_rows_equals_one_float64_sum(monkeypatch):
    """The converter's SQNR is summed a few rows at a time (a 7B head in float64 would be 4.4 GB); the value
    is the one a single float64 sum gives, across chunk boundaries and with the approximation made per chunk."""
    from omni_quant.format import quant_math
    from omni_quant.format.quant_math import dequantize, quantize, sqnr_db, sqnr_db_rows

    monkeypatch.setattr(quant_math, "SQNR_CHUNK_ELEMENTS", 3 * 64 + 5)  # 3 rows a chunk, 37 rows: a short last one
    w = torch.randn(37, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    q, s, z = quantize(w, 32)
    approx = dequantize(q, s, z, torch.float32)
    ref = w.double()
    want = 10 * torch.log10(ref.pow(2).sum() / (ref - approx.double()).pow(2).sum()).item()
    asked = []

    def rows(a, b):
        asked.append((a, b))
        return dequantize(q[a:b], s[a:b], z[a:b], torch.float32)

    assert sqnr_db_rows(w, rows) == pytest.approx(want, rel=1e-12)
    assert asked[0] == (0, 3) and asked[-1] == (36, 39) and len(asked) == 13
    assert sqnr_db(w, approx) == pytest.approx(want, rel=1e-12)
    assert sqnr_db(w, w) == float("inf")
    nan = approx.clone()
    nan[20, 3] = float("nan")
    assert sqnr_db(w, nan) != sqnr_db(w, nan)  # NaN in any chunk is NaN


def _untied(src: Path, dst: Path) -> Path:
    """A copy of the GGUF ``src`` at ``dst`` with an ``output.weight`` (a copy of ``token_embd.weight``'s
    bytes and type): an untied model, as most larger ones are (Qwen2.5-Coder-1.5B)."""
    import numpy as np
    from gguf_files import write_tensors, writer_like

    reader, writer = writer_like(src, dst)
    tensors = [(t.name, np.asarray(t.data), t.tensor_type) for t in reader.tensors]
    embd = next(x for x in tensors if x[0] == "token_embd.weight")
    write_tensors(writer, [*tensors, ("output.weight", embd[1], embd[2])])
    return dst


def test_an_untied_gguf_converts_to_at_most_its_size_plus_5_percent(tmp_path):
    """Issue 31's size rule: the cpu_int4 checkpoint (every file: weights, config, tokenizer, report) is at most
    the GGUF's size plus 5%. A tied model's output is larger by design: the converter adds a 4-bit head beside
    the embedding table (docs/cpu_int4.md, the input embedding), so the rule is checked on an untied file.
    SmolLM2's GGUF cut to its first 4 of 30 blocks (tests/gguf_files.py): every tensor type of the file, the
    embedding and head at full size (the larger share of the bytes), a calibration of seconds."""
    from gguf_files import fewer_layers

    from harness.models.registry import gguf_path
    from omni_quant.conversion.gguf_file import convert_gguf

    src = _untied(fewer_layers(gguf_path("smollm2-135m"), tmp_path / "four.gguf", 4), tmp_path / "untied.gguf")
    dst = tmp_path / "int4"
    convert_gguf(src, dst)
    report = json.loads((dst / "quantization_report.json").read_text())
    assert not any("(tied)" in t["name"] for t in report["tensors"])
    assert report["embedding"]["quantized"], report["embedding"]
    size = sum(f.stat().st_size for f in dst.iterdir())
    assert size <= 1.05 * src.stat().st_size, (size, src.stat().st_size)


def test_dequantizing_a_few_rows_at_a_time_gives_the_gguf_packages_values(monkeypatch):
    """gguf's numpy dequantization of a whole Q6_K head held ~5 GB of temporaries (Qwen2.5-Coder-1.5B);
    row chunks give the same float32 values, chunk boundaries and a short last chunk included."""
    import numpy as np
    from gguf import GGUFReader, dequantize

    from harness.models.registry import gguf_path
    from omni_quant.conversion import tensor_sources

    t = next(x for x in GGUFReader(str(gguf_path("smollm2-135m"))).tensors if x.name == "blk.2.ffn_down.weight")
    assert t.tensor_type.name == "Q4_1" and np.asarray(t.data).shape[0] == 576
    monkeypatch.setattr(tensor_sources, "DEQUANTIZE_ROWS", 100)  # 6 chunks, the last of 76 rows
    got = tensor_sources.dequantize_rows(np.asarray(t.data), t.tensor_type)
    want = dequantize(np.asarray(t.data), t.tensor_type)
    assert got.dtype == np.float32 and got.flags.writeable and np.array_equal(got, want)


def test_super_blocks_fitted_by_blocks_of_rows_equal_one_fit(tmp_path, monkeypatch):
    """write_quantized_super_blocks fits ROW_BLOCK rows at a time (a 151936-row head in one fit held 5 GB of
    float32 temporaries): rows are independent, so the stored tensors are the one-fit ones."""
    from omni_quant.conversion import output
    from omni_quant.format import super_blocks
    from omni_quant.format.packing import pack

    monkeypatch.setattr(output, "ROW_BLOCK", 64)  # 300 rows: five blocks, the last of 44
    w = (torch.randn(300, 512, generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16)
    imp = torch.rand(512, generator=torch.Generator().manual_seed(4))
    writer = output.ShardWriter(tmp_path)
    db, _ = output.write_quantized_super_blocks(writer, "m", w, imp)
    whole = super_blocks.quantize(w, imp)
    want = (pack(whole[0]), *whole[1:])
    for name, t in zip(super_blocks.TENSORS, want, strict=True):
        assert torch.equal(writer.pending[f"m.{name}"], t.to(writer.pending[f"m.{name}"].dtype)), name
    assert db > 10
