"""Fused decoder layers (omni_quant.runtime.fused_layers, on by default under cpu_int4) against vLLM's own layers in
a real engine, on a model whose layers fuse: a tiny Llama (2 layers, hidden 256, K a multiple of the 256-weight
super-block) converted with the ``q4k`` recipe, its output head scaled so that greedy choices are clear rather than
the near-ties of random weights. The bundled SmolLM2 (hidden 576) never fuses. Eager: the ops the fused path replaces
are vLLM's eager code; compiled mode reorders float sums on both sides.

How close is close enough is measured, not chosen: vLLM's own eager layers with its native RMSNorm instead of the
C++ one omni's eager default uses (``OMNI_IR_CPU_NORMS=0``) part from them by some log-probability (bf16 rounding
in a different order, magnified by the scaled head); the fused layers may part from vLLM's by at most 1.5 times that,
and their greedy tokens may differ only where two candidates were that nearly tied.

Qwen2.5-Coder-1.5B in cpu_int4 (hidden 1536, its layers fuse) runs the same comparison where its checkpoint
was fetched (``python -m harness models fetch qwen2.5-coder-1.5b-int4``; CI has no model hub, so CI runs the
tiny model only). Its parameter exists only then: nothing is skipped either way."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from conftest import assert_greedy_close, clean_env, run_engine, step_gap
from harness.models.registry import default_cache_dir
from skips import NO_SUPER_BLOCK_KERNEL

pytestmark = pytest.mark.engine

PROMPTS = [[1, 17, 42, 99, 7, 300, 12], [1, 250, 3, 8, 8, 91, 77, 5], list(range(20, 120))]
QWEN = default_cache_dir() / "qwen2.5-coder-1.5b-int4"
MODELS = ["tiny", *(["qwen2.5-coder-1.5b-int4"] if (QWEN / "config.json").is_file() else [])]
"""The fusable models of this machine: the tiny Llama always, Qwen where it was fetched."""
LAYERS = {"tiny": 2, "qwen2.5-coder-1.5b-int4": 28}


@pytest.fixture(scope="module")
def tiny_fusable(tmp_path_factory):
    from omni_platform.testing import make_tiny_llama
    from omni_quant.conversion.checkpoint import convert

    root = tmp_path_factory.mktemp("fusable")
    src = make_tiny_llama(root / "bf16", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2,
                          vocab_size=512, dtype="bfloat16")
    weights = src / "model.safetensors"
    tensors = load_file(weights)
    tensors["lm_head.weight"] = (tensors["lm_head.weight"].float() * 40).bfloat16()  # peaked next-token choices
    save_file(tensors, weights, metadata={"format": "pt"})
    convert(src, root / "q4k", recipe="q4k")
    return root / "q4k"


@pytest.mark.parametrize("model", MODELS)
def test_fused_layers_give_vllms_greedy_tokens_within_rounding(model, request, tmp_path):
    NO_SUPER_BLOCK_KERNEL.skip_if_holds()
    path = request.getfixturevalue("tiny_fusable") if model == "tiny" else QWEN
    config = {"llm": {"model": str(path), "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 4,
                      "kv_cache_memory_bytes": 64 << 20, "skip_tokenizer_init": True},
              "prompts": PROMPTS, "max_tokens": 24, "logprobs": 5}
    env = dict(VLLM_PLUGINS="omni", OMNI_INT4_KERNEL="native", VLLM_CACHE_ROOT=str(tmp_path / "cache"))
    fused = run_engine(config, clean_env(OMNI_FUSED_LAYERS="1", **env))
    plain = run_engine(config, clean_env(OMNI_FUSED_LAYERS="0", **env))
    native = run_engine(config, clean_env(OMNI_FUSED_LAYERS="0", OMNI_IR_CPU_NORMS="0", **env))
    (worker_fused,), (worker_plain,) = fused["workers"], plain["workers"]
    assert worker_fused["extension_reports"]["quant"]["fused_layers"] == LAYERS[model]
    assert worker_plain["extension_reports"]["quant"]["fused_layers"] == 0
    vllm_own = step_gap(native, plain)
    assert 0 < vllm_own < 1.0, vllm_own  # the two vLLM paths differ, by rounding
    agree = assert_greedy_close(fused, plain, step_nats=1.5 * vllm_own)
    print(f"{model}: fused vs vLLM's layers: {step_gap(fused, plain):.4f} nats at most; vLLM's two eager norms: "
          f"{vllm_own:.4f}; tokens agreeing before they part: {agree}")
    assert all(n >= 5 for n in agree), agree  # the first tokens are clear choices: no rounding parts them
    assert all(len(t) == 24 for t in fused["token_ids"])
