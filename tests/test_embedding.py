"""The quantized input embedding (issue 31, item 4): the lookup of stored 4- and 8-bit rows equals the whole
table dequantized and indexed, bit for bit (eager and compiled); vLLM's VocabParallelEmbedding builds, loads
(taking its tensor-parallel shard) and looks it up through CpuInt4Config; older checkpoints keep a bf16
embedding; the converters write it (GGUF types kept bit for bit, the HF path by the recipe, the opt-out)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omni_quant.format import super_blocks
from omni_quant.format.packing import pack
from omni_quant.format.quant_math import quantize, quantize_int8_groups
from omni_quant.runtime.embedding import TENSORS, dequantize_rows, lookup

V, D = 300, 512  # D a multiple of 256: every scheme fits


def _table(scheme: str, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The stored tensors of ``w`` ``[V, D]`` in ``scheme`` (as the converter writes them)."""
    if scheme == "groups":
        q, s, z = quantize(w, 32, torch.bfloat16)
        return pack(q), s, z
    if scheme == "super_blocks":
        q, sc, mn, d, dmin = super_blocks.quantize(w)
        return pack(q), sc, mn, d, dmin
    q, d = quantize_int8_groups(w)
    return q, d


@pytest.fixture(scope="module")
def weights() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(V, D, generator=g) * 0.05


IDS = torch.tensor([0, 5, 5, 299, 17, 0, 123, 298, 1, 64])


@pytest.mark.parametrize("scheme", ["groups", "super_blocks", "int8"])
def test_lookup_equals_the_whole_table_dequantized_and_indexed(weights, scheme):
    table = _table(scheme, weights)
    want = dequantize_rows(scheme, *table).to(torch.bfloat16)[IDS]
    got = lookup(scheme, table, IDS, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (len(IDS), D)
    assert torch.equal(got, want)
    two_d = lookup(scheme, table, IDS.reshape(2, 5), torch.bfloat16)  # any shape of ids
    assert torch.equal(two_d.reshape(-1, D), want)
    # and it is the scheme's own dequantization (the reference the converter measures SQNR against)
    if scheme == "super_blocks":
        ref = super_blocks.dequantize(torch.stack((table[0] & 15, table[0] >> 4), -1).reshape(V, D), *table[1:])
        assert torch.equal(got, ref.to(torch.bfloat16)[IDS])
    assert (got.float() - weights[IDS]).abs().max() < 0.05 * weights.abs().max()


@pytest.mark.parametrize("scheme", ["groups", "super_blocks", "int8"])
def test_compiled_lookup_is_bit_for_bit_the_eager_one(weights, scheme):
    """torch.compile (inductor, dynamic ids as vLLM's compiled mode traces them) gives the same bits: every
    product of the dequantization is exact in float32, so fused multiply-adds change nothing."""
    torch._dynamo.reset()
    table = _table(scheme, weights)
    compiled = torch.compile(lambda ids: lookup(scheme, table, ids, torch.bfloat16), dynamic=True, fullgraph=True)
    want = dequantize_rows(scheme, *table).to(torch.bfloat16)
    for ids in (IDS, torch.arange(V), torch.tensor([7])):
        assert torch.equal(compiled(ids), want[ids])


def _config(scheme: str, module: str = "model.embed_tokens", fmt: int = 4):
    from omni_quant.runtime.config import CpuInt4Config

    return CpuInt4Config(group_size=32, format_version=fmt, embedding_modules=[module],
                         group_size_per_module={module: 32} if scheme != "int8" else {},
                         bits_per_module={module: 8} if scheme == "int8" else None,
                         super_block_modules=[module] if scheme == "super_blocks" else None)


@pytest.mark.parametrize("scheme", ["groups", "super_blocks", "int8"])
@pytest.mark.parametrize("prefix", ["", "model.embed_tokens"])
def test_vllm_vocab_parallel_embedding_loads_and_looks_up_the_stored_rows(weights, scheme, prefix):
    """vLLM's own layer (padded to 320 rows), its own weight_loader, its own forward; an empty prefix is how
    vLLM 0.28's Llama builds its embedding. No bf16 table is created."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    from omni_quant.runtime.embedding import CpuInt4EmbeddingMethod

    layer = VocabParallelEmbedding(V, D, params_dtype=torch.bfloat16, quant_config=_config(scheme), prefix=prefix,
                                   disable_tp=True)
    assert isinstance(layer.quant_method, CpuInt4EmbeddingMethod) and layer.quant_method.scheme == scheme
    assert not hasattr(layer, "weight")
    table = _table(scheme, weights)
    for name, t in zip(TENSORS[scheme], table, strict=True):
        param = getattr(layer, name)
        assert param.dtype == t.dtype and param.shape == (layer.num_embeddings_padded, t.shape[1])
        param.weight_loader(param, t)
    layer.quant_method.process_weights_after_loading(layer)
    got = layer(IDS)
    assert torch.equal(got, dequantize_rows(scheme, *table).to(torch.bfloat16)[IDS])
    stored = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert stored < layer.num_embeddings_padded * D * 2 * (0.6 if scheme == "int8" else 0.35)


def test_the_weight_loader_takes_this_workers_vocabulary_shard(weights):
    """Under tensor parallelism vLLM gives each worker a range of vocabulary rows: rank 1 of 2 of a 300-row
    vocabulary padded to 320 holds rows 160..299 and 20 rows of zeros; every stored tensor is cut the same way."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    layer = VocabParallelEmbedding(V, D, params_dtype=torch.bfloat16, quant_config=_config("super_blocks"),
                                   disable_tp=True)
    layer.shard_indices = VocabParallelEmbedding._get_indices(layer.num_embeddings_padded, layer.org_vocab_size_padded,
                                                              V, V, tp_rank=1, tp_size=2)
    table = _table("super_blocks", weights)
    for name, t in zip(TENSORS["super_blocks"], table, strict=True):
        getattr(layer, name).weight_loader(getattr(layer, name), t)
    rows = V - 160
    for name, t in zip(TENSORS["super_blocks"], table, strict=True):
        param = getattr(layer, name).data
        assert torch.equal(param[:rows], t[160:]) and not param[rows:].any()
    got = layer.quant_method.embedding(layer, torch.tensor([0, rows - 1]))  # this worker's local row ids
    assert torch.equal(got, dequantize_rows("super_blocks", *table).to(torch.bfloat16)[[160, V - 1]])


def test_an_older_checkpoint_keeps_a_bf16_embedding():
    """A format 1-3 config (no embedding_modules) builds vLLM's own bf16 table."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod, VocabParallelEmbedding

    from omni_quant.runtime.config import CpuInt4Config

    old = CpuInt4Config.from_config({"quant_method": "cpu_int4", "group_size": 32, "format_version": 3,
                                     "super_block_modules": ["lm_head"]})
    layer = VocabParallelEmbedding(V, D, quant_config=old, prefix="model.embed_tokens", disable_tp=True)
    assert isinstance(layer.quant_method, UnquantizedEmbeddingMethod) and layer.weight.shape == (320, D)
    with pytest.raises(ValueError, match="needs format_version 4"):
        _config("groups", fmt=3)
    with pytest.raises(ValueError, match="embedding_modules must be a list"):
        CpuInt4Config(format_version=4, embedding_modules="model.embed_tokens")


# --- the converters ---------------------------------------------------------------------------------------------

def _load(out) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(out.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _stored(tensors, scheme, module="model.embed_tokens"):
    return tuple(tensors[f"{module}.{n}"] for n in TENSORS[scheme])


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0", "Q4_1", "Q8_0", "Q5_0"])
def test_gguf_embedding_types_are_kept_or_requantized(tmp_path, kind):
    """llama.cpp's token_embd bytes: Q4_K and Q8_0 come back bit for bit (codes, constants, and the looked-up
    rows equal the gguf package's dequantization rounded to bf16); Q4_0/Q4_1 keep their codes (constants rounded
    to bf16); any other type is requantized to 8 bits per group of 32."""
    import gguf

    from omni_quant.conversion.embedding import from_gguf
    from omni_quant.conversion.output import ShardWriter

    w = (torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 0.05).numpy()
    if kind == "Q4_K":
        from test_super_blocks import _q4_k_bytes

        raw = _q4_k_bytes(*(p.numpy() for p in super_blocks.quantize(torch.from_numpy(w))))
    else:
        raw = gguf.quantize(w, gguf.GGMLQuantizationType[kind])
    want = gguf.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(64, 256)
    writer = ShardWriter(tmp_path)
    written = from_gguf(writer, "model.embed_tokens", raw, kind, 64, 256, lambda: want)
    writer.finish()
    expected = {"Q4_K": ("super_blocks", 4), "Q4_0": ("groups", 4), "Q4_1": ("groups", 4), "Q8_0": ("int8", 8),
                "Q5_0": ("int8", 8)}[kind]
    assert (written.scheme, written.bits) == expected
    assert ("requantized" in written.action) == (kind == "Q5_0")
    table = _stored(_load(tmp_path), written.scheme)
    got = lookup(written.scheme, table, torch.arange(64), torch.bfloat16)
    if kind in ("Q4_K", "Q8_0"):
        assert written.sqnr_db is None
        assert torch.equal(got, torch.from_numpy(want).to(torch.bfloat16))
    elif kind in ("Q4_0", "Q4_1"):
        from omni_quant.format.gguf_blocks import to_cpu_int4

        codes, _, _ = to_cpu_int4(raw, kind, 64, 256)
        assert np.array_equal(torch.stack((table[0] & 15, table[0] >> 4), -1).reshape(64, 256).numpy(), codes)
        assert (got.float().numpy() - want).__abs__().max() < 2 ** -7 * np.abs(want).max()
    else:
        assert written.sqnr_db > 35


@pytest.fixture(scope="module")
def tiny_tied_llama(tmp_path_factory):
    """A random 2-layer Llama with hidden 256 (super-blocks fit) whose head is tied to its embedding."""
    from omni_platform.testing import make_tiny_llama

    out = make_tiny_llama(tmp_path_factory.mktemp("tiny"), hidden_size=256, intermediate_size=512)
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file

    t = load_file(str(out / "model.safetensors"))
    t.pop("lm_head.weight")
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize(("recipe", "keep", "scheme"), [
    ("q4", [], "groups"), ("q4k", [], "super_blocks"), ("q8", [], "int8"), ("q4", ["embed_tokens"], None),
    ("q4", ["lm_head"], None),
])
def test_hf_converter_quantizes_the_embedding_by_the_recipe(tiny_tied_llama, tmp_path, recipe, keep, scheme):
    """The HF path: the recipe's width and layout; --keep-bf16 embed_tokens copies it; a tied head kept in bf16
    keeps the embedding bf16 too (vLLM reads that head from the embedding's table). A tied head that is
    quantized is written beside the quantized table, untied: no bf16 table at all."""
    from omni_quant.conversion.checkpoint import convert

    out = tmp_path / "out"
    convert(tiny_tied_llama, out, keep_bf16=keep, recipe=recipe)
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    tensors = _load(out)
    report = json.loads((out / "quantization_report.json").read_text())["embedding"]
    if scheme is None:
        assert "embedding_modules" not in qc and qc["format_version"] < 4
        assert tensors["model.embed_tokens.weight"].dtype == torch.float32  # copied as it was
        assert report["quantized"] is False and report["why_not"]
        assert cfg["tie_word_embeddings"] is (keep == ["lm_head"])
        return
    assert qc["embedding_modules"] == ["model.embed_tokens"] and qc["format_version"] == 4
    assert "model.embed_tokens.weight" not in tensors and cfg["tie_word_embeddings"] is False
    assert ("model.embed_tokens" in qc.get("super_block_modules", [])) == (scheme == "super_blocks")
    assert (qc.get("bits_per_module", {}).get("model.embed_tokens") == 8) == (scheme == "int8")
    assert report == {"quantized": True, "module": "model.embed_tokens", "scheme": scheme, "group_size": 32,
                      "bits": 8 if scheme == "int8" else 4, "bytes": report["bytes"]}
    assert "lm_head.qweight" in tensors or "lm_head.qweight8" in tensors  # the head, quantized on its own
    from omni_quant.runtime.config import CpuInt4Config

    method = CpuInt4Config.from_config(qc).embedding_method("model.embed_tokens")
    rows = lookup(method.scheme, _stored(tensors, scheme), torch.arange(512), torch.float32)
    from safetensors.torch import load_file

    src = load_file(str(tiny_tied_llama / "model.safetensors"))["model.embed_tokens.weight"]
    from omni_quant.format.quant_math import sqnr_db

    assert sqnr_db(src, rows) > (35 if scheme == "int8" else 15)


def test_keep_bf16_names_only_real_modules(tiny_tied_llama, tmp_path):
    from omni_quant.conversion.checkpoint import convert
    from omni_quant.conversion.output import ConversionError

    with pytest.raises(ConversionError, match="embed_token matches no linear layer"):
        convert(tiny_tied_llama, tmp_path / "out", keep_bf16=["embed_token"])
