"""Any model in (#11): tiny random checkpoints of architectures vLLM 0.28 serves, built on the fly from
transformers configs, convert with the defaults (no architecture list anywhere), load with
VLLM_PLUGINS=omni, and match their dequantized reference: the same 4-bit values in plain bf16, so
what differs is only the kernel's arithmetic (teacher-forced prompt log-probabilities, SQNR in dB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import clean_env, run_engine
from omni_quant.conversion.checkpoint import convert
from omni_quant.format import super_blocks
from omni_quant.format.packing import unpack
from omni_quant.format.quant_math import dequantize, dequantize_int8, dequantize_int8_groups, sqnr_db

SMALL = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=512, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, initializer_range=0.2)
# model_type -> (extra config, what it exercises)
ARCHS = {
    "llama": ({"tie_word_embeddings": True}, "tied head"),
    "mistral": ({"sliding_window": 64, "tie_word_embeddings": False}, "sliding window, untied head"),
    "qwen2": ({"tie_word_embeddings": False}, "q/k/v biases"),
    "qwen3": ({"head_dim": 32, "tie_word_embeddings": True}, "q/k norms"),
    "phi3": ({"tie_word_embeddings": False}, "checkpoint-fused qkv_proj and gate_up_proj"),
    "gemma": ({"head_dim": 32}, "scaled embedding, GeGLU"),
    "granite": ({"tie_word_embeddings": True}, "scaled residuals and logits"),
    "olmo2": ({"tie_word_embeddings": False}, "post-norms"),
    "starcoder2": ({"tie_word_embeddings": True, "use_bias": True}, "biases everywhere, GELU MLP (c_fc/c_proj)"),
    "gpt_neox": ({"tie_word_embeddings": False}, "checkpoint-fused query_key_value whose rows vLLM permutes at load, "
                                                 "the head named embed_out"),
}
RECIPE_CASES = {"q8-qwen2": ("qwen2", "q8"), "q4-head8-llama": ("llama", "q4-head8"),
                # every linear in super-blocks (K a multiple of 256): the decoder layers run fused (two ops each,
                # omni_quant.runtime.fused_layers), with q/k/v biases (Qwen2) and without (Llama)
                "fused-qwen2": ("qwen2", "q4k"), "fused-llama": ("llama", "q4k")}
WIDE = dict(hidden_size=256, intermediate_size=512)  # the fused cases' sizes (head_dim 64)
# 8-bit layers: every linear of an untied model with q/k/v biases; the head of a tied one (from its embedding)
PROMPTS = [[1, 17, 42, 99, 7, 300, 5, 5, 5, 12, 400, 33], [1, 250, 3, 8, 8, 91, 77, 2, 450, 6, 19, 301]]


def _checkpoint(model_type: str, out: Path, sizes: dict | None = None) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    extra, _ = ARCHS[model_type]
    cfg = AutoConfig.for_model(model_type, **{**SMALL, **extra, **(sizes or {})})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def _dequantized_reference(int4: Path, out: Path) -> Path:
    """The cpu_int4 checkpoint with every quantized weight dequantized back to bf16 (same values)."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for f in sorted(int4.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    out_t = {}
    for name, t in tensors.items():
        if name.endswith(".qweight") and f"{name[: -len('.qweight')]}.sub_scales" in tensors:  # super-blocks
            m = name[: -len(".qweight")]
            parts = [tensors[f"{m}.{p}"] for p in ("sub_scales", "sub_mins", "super_scales", "super_mins")]
            out_t[f"{m}.weight"] = super_blocks.dequantize(unpack(t), *parts).to(torch.bfloat16)
        elif name.endswith(".qweight"):
            m = name[: -len(".qweight")]
            out_t[f"{m}.weight"] = dequantize(unpack(t), tensors[f"{m}.scales"], tensors[f"{m}.zeros"], torch.bfloat16)
        elif name.endswith(".qweight8"):
            m, s = name[: -len(".qweight8")], tensors[f"{name[: -len('.qweight8')]}.scales8"]
            # a quantized input embedding is 8-bit per group of 32 (scales8 [V, D/32]); a linear layer per row
            out_t[f"{m}.weight"] = (dequantize_int8_groups(t, s).to(torch.bfloat16) if s.dim() == 2
                                    else dequantize_int8(t, s, torch.bfloat16))
        elif not name.endswith((".scales", ".zeros", ".scales8", ".sub_scales", ".sub_mins", ".super_scales",
                                ".super_mins")):
            out_t[name] = t
    out.mkdir()
    save_file(out_t, str(out / "model.safetensors"))
    cfg = json.loads((int4 / "config.json").read_text())
    cfg.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _engine_config(model: Path) -> dict:
    return {"llm": {"model": str(model), "enforce_eager": True, "skip_tokenizer_init": True, "max_model_len": 128,
                    "max_num_seqs": 2, "kv_cache_memory_bytes": 32 << 20},
            "prompts": PROMPTS, "max_tokens": 1, "prompt_logprobs": True}


def _log_probs(run: dict) -> list[float]:
    return [v for p in run["prompt_logprobs"] for v in p if v is not None]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every architecture (and the C16 keep list) converted with the defaults and its dequantized
    reference, then all of them teacher-forced in ONE engine process, one engine after another
    (tests/engine_probe.py "runs"): 20 small engines, one Python start and one vLLM import."""
    root = tmp_path_factory.mktemp("archs")
    cases = {}
    for name in [*sorted(ARCHS), "c16", *RECIPE_CASES]:
        arch, recipe = RECIPE_CASES.get(name, ("llama" if name == "c16" else name, "default"))
        src = _checkpoint(arch, root / name / "bf16", WIDE if name.startswith("fused-") else None)
        keep = ["q_proj", "k_proj", "v_proj"] if name == "c16" else None
        reports = convert(src, root / name / "int4", keep_bf16=keep, recipe=recipe)  # otherwise the defaults
        ref = _dequantized_reference(root / name / "int4", root / name / "ref")
        cases[name] = {"src": src, "int4": root / name / "int4", "ref": ref, "reports": reports}
    configs = [_engine_config(c[kind]) for c in cases.values() for kind in ("int4", "ref")]
    runs = iter(run_engine({"runs": configs}, clean_env(VLLM_PLUGINS="omni"), timeout=1800)["runs"])
    for case in cases.values():
        got, want = next(runs), next(runs)
        case["got"], case["want"] = _log_probs(got), _log_probs(want)
        case["fused_layers"] = got["workers"][0]["extension_reports"]["quant"]["fused_layers"]
    return cases


@pytest.mark.engine
@pytest.mark.parametrize("model_type", sorted(ARCHS))
def test_each_architecture_converts_with_the_defaults_and_matches_its_reference(model_type, converted):
    case = converted[model_type]
    report = json.loads((case["int4"] / "quantization_report.json").read_text())
    assert report["architecture"] == json.loads((case["src"] / "config.json").read_text())["architectures"][0]
    assert sum(r.action == "quantized" for r in case["reports"]) >= 2 * 4, "every decoder layer's linears"
    qc = json.loads((case["int4"] / "config.json").read_text())["quantization_config"]
    # the input embedding quantized where vLLM's model builds it with the quant config (the reference holds its
    # dequantized rows, so the comparison covers the lookup); Gemma's logits are its embedding, GPT-NeoX's
    # embedding and the Transformers backend's (olmo2, starcoder2) take no quant config: bf16
    assert ("embedding_modules" in qc) == (model_type not in ("gemma", "gpt_neox", "olmo2", "starcoder2")), qc
    got, want = case["got"], case["want"]
    assert len(got) == len(want) == 2 * (len(PROMPTS[0]) - 1)
    # what differs is the kernels' arithmetic (int8 activations): ~20-40 dB; a wrong layout or mapping gives < 10
    assert sqnr_db(torch.tensor(want), torch.tensor(got)) >= 20.0, (model_type, got[:4], want[:4])


@pytest.mark.engine
def test_c16_a_checkpoint_keeping_a_fused_layer_loads_and_matches(converted):
    """--keep-bf16 q_proj k_proj v_proj (all members of vLLM's qkv_proj): the engine builds qkv_proj
    unquantized from the bf16 tensors, the rest in 4 bits, and matches the dequantized reference."""
    case = converted["c16"]
    assert not any(r.action == "quantized" and r.name.split(".")[-2] in ("q_proj", "k_proj", "v_proj")
                   for r in case["reports"])
    assert sqnr_db(torch.tensor(case["want"]), torch.tensor(case["got"])) >= 20.0


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(n for n in RECIPE_CASES if not n.startswith("fused-")))
def test_8_bit_layers_of_a_recipe_load_and_match_their_reference(name, converted):
    """--recipe q8 / q4-head8: the 8-bit layers are written as such (format version 2), vLLM builds them
    with omni's 8-bit method (torch's _weight_int8pack_mm), and the engine matches the dequantized reference."""
    case = converted[name]
    _, recipe = RECIPE_CASES[name]
    qc = json.loads((case["int4"] / "config.json").read_text())["quantization_config"]
    layers = [r for r in case["reports"] if not r.action.startswith("embedding")]
    eight = {r.name.split(" <- ")[0].rsplit(".", 1)[0] for r in layers if r.bits == 8}
    four = [r for r in layers if r.bits == 4]
    embedding = "model.embed_tokens"  # quantized at the recipe's body width (format 4)
    assert qc["format_version"] == 4 and qc["recipe"] == recipe and qc["embedding_modules"] == [embedding]
    assert set(qc["bits_per_module"]) - {embedding} == eight
    assert (qc["bits_per_module"].get(embedding) == 8) == (recipe == "q8")
    if recipe == "q8":
        assert not four and len(eight) == 2 * 7 + 1, "every linear of both layers and the head"
    else:
        assert eight == {"lm_head"} and len(four) == 2 * 7
    assert sqnr_db(torch.tensor(case["want"]), torch.tensor(case["got"])) >= 20.0


@pytest.mark.engine
@pytest.mark.parametrize("name", ["fused-llama", "fused-qwen2"])
def test_super_block_layers_run_fused_and_match_their_reference(name, converted):
    """Every linear in super-blocks (--recipe q4k at K = 256 and 512): where the native super-block kernel runs,
    both decoder layers run omni_quant.runtime.fused_layers' two ops in the engine (the worker says so), and the
    teacher-forced log-probabilities match the dequantized reference as the unfused layers do."""
    from omni_quant.kernels import w4a8 as native
    from omni_quant.runtime.config import PER_GROUP_ISAS

    case = converted[name]
    qc = json.loads((case["int4"] / "config.json").read_text())["quantization_config"]
    assert sum(".layers." in m for m in qc["super_block_modules"]) == 2 * 7, "every linear of both layers"
    # the super-block kernel loads them (an AVX-VNNI CPU rewrites them per group; no kernel: torch's int4pack)
    super_blocks = native.available() and native.best_isa() not in PER_GROUP_ISAS
    assert case["fused_layers"] == (2 if super_blocks else 0)
    assert sqnr_db(torch.tensor(case["want"]), torch.tensor(case["got"])) >= 20.0
