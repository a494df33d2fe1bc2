"""Fused decoder layers (omni_quant.fused_layers, on by default under cpu_int4) against vLLM's own layers in a real
engine, on a model whose layers fuse: a tiny Llama (2 layers, hidden 256, K a multiple of the 256-weight super-block)
converted with the ``q4k`` recipe, its output head scaled so that greedy choices are clear rather than the near-ties
of random weights. The bundled SmolLM2 (hidden 576) never fuses. Eager: the ops the fused path replaces are vLLM's
eager code; compiled mode reorders float sums on both sides."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from conftest import assert_greedy_close, clean_env, run_engine
from skips import NO_SUPER_BLOCK_KERNEL

pytestmark = pytest.mark.engine

PROMPTS = [[1, 17, 42, 99, 7, 300, 12], [1, 250, 3, 8, 8, 91, 77, 5], list(range(20, 120))]


@pytest.fixture(scope="module")
def tiny_fusable(tmp_path_factory):
    from omni_platform.testing import make_tiny_llama
    from omni_quant.convert import convert

    root = tmp_path_factory.mktemp("fusable")
    src = make_tiny_llama(root / "bf16", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                          vocab_size=512, dtype="bfloat16")
    weights = src / "model.safetensors"
    tensors = load_file(weights)
    tensors["lm_head.weight"] = (tensors["lm_head.weight"].float() * 40).bfloat16()  # peaked next-token choices
    save_file(tensors, weights, metadata={"format": "pt"})
    convert(src, root / "q4k", recipe="q4k")
    return root / "q4k"


def test_fused_layers_give_vllms_greedy_tokens_within_rounding(tiny_fusable, tmp_path):
    NO_SUPER_BLOCK_KERNEL.skip_if_holds()
    config = {"llm": {"model": str(tiny_fusable), "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 4,
                      "kv_cache_memory_bytes": 16 << 20, "skip_tokenizer_init": True},
              "prompts": PROMPTS, "max_tokens": 24, "logprobs": 5}
    env = dict(VLLM_PLUGINS="omni", OMNI_INT4_KERNEL="native", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    fused = run_engine(config, clean_env(OMNI_FUSED_LAYERS="1", **env))
    plain = run_engine(config, clean_env(OMNI_FUSED_LAYERS="0", **env))
    (worker_fused,), (worker_plain,) = fused["workers"], plain["workers"]
    assert worker_fused["extension_reports"]["quant"]["fused_layers"] == 2
    assert worker_plain["extension_reports"]["quant"]["fused_layers"] == 0
    agree = assert_greedy_close(fused, plain, step_nats=0.05)
    # with clear choices the rounding of the two paths parts nothing in the first tokens
    assert all(n >= 8 for n in agree), agree
    assert all(len(t) == 24 for t in fused["token_ids"])
