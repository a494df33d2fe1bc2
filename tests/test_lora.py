"""C19: LoRA adapters on a cpu_int4 base (base weights stay 4-bit; vLLM adds the adapter's delta).

vLLM's LoRA wrappers look for a tensor named ``weight``/``qweight`` on the layers they wrap; omni exposes the
repacked weight as ``qweight`` (``omni_quant.runtime.config._expose_for_lora``) and
``_patch_lora_on_quantized_embeddings``
lets vLLM wrap a quantized output head and leave a quantized input embedding alone. On CPU vLLM turns
compilation off when LoRA is enabled (``CpuPlatform.check_and_update_config``), so the LoRA engine here runs
without ``enforce_eager`` and is eager either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import clean_env, run_engine

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def make_peft_adapter(dst: Path, layers: int, hidden: int, kv_out: int, rank: int, zero_b: bool, seed: int) -> Path:
    """Write a PEFT-format LoRA adapter on ``q_proj``/``v_proj`` (``adapter_config.json`` and
    ``adapter_model.safetensors``; A ``[rank, hidden]``, B ``[out, rank]``, bf16), B all zero if ``zero_b``."""
    dst.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for name, out in (("q_proj", hidden), ("v_proj", kv_out)):
            key = f"base_model.model.model.layers.{i}.self_attn.{name}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, hidden, generator=g) * 0.05).to(torch.bfloat16)
            b = torch.zeros(out, rank) if zero_b else torch.randn(out, rank, generator=g) * 0.05
            tensors[f"{key}.lora_B.weight"] = b.to(torch.bfloat16)
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": "smollm2-135m"}))
    return dst


@pytest.mark.engine
def test_c19_lora_adapters_on_a_cpu_int4_base(int4_model_dir, tmp_path):
    cfg = json.loads((int4_model_dir / "config.json").read_text())
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    kv_out = cfg["num_key_value_heads"] * hidden // cfg["num_attention_heads"]
    zero = make_peft_adapter(tmp_path / "zero", layers, hidden, kv_out, 8, zero_b=True, seed=0)
    rand = make_peft_adapter(tmp_path / "rand", layers, hidden, kv_out, 8, zero_b=False, seed=1)
    common = {"model": str(int4_model_dir), "max_model_len": 256}
    lora = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2}
    adapters = {"zero": str(zero), "rand": str(rand), "rand-again": str(rand)}
    run = run_engine({"runs": [
        {"llm": {**common, "enforce_eager": True}, "prompts": PROMPTS, "max_tokens": 16},
        {"llm": {**common, **lora, "enforce_eager": True}, "prompts": PROMPTS, "max_tokens": 16, "lora": adapters},
        # compiled mode asked for: vLLM runs a LoRA engine on CPU without compilation (and with torch's native
        # ops rather than the eager path's C++ ones, so its tokens are compared with its own base run)
        {"llm": {**common, **lora}, "prompts": PROMPTS, "max_tokens": 16, "lora": adapters},
    ]}, clean_env(VLLM_PLUGINS="omni"))
    plain, eager, compiled = run["runs"]
    assert "omni-patches: LoRA leaves the quantized input embedding" in run.log
    assert eager["token_ids"] == plain["token_ids"], "enabling LoRA changed the base model's greedy tokens"
    for mode in (eager, compiled):
        base, by_adapter = mode["token_ids"], mode["lora_token_ids"]
        assert by_adapter["zero"] == base, "an adapter with B = 0 changed the tokens"
        changed = [a != b for a, b in zip(by_adapter["rand"], base, strict=True)]
        assert all(changed), f"the random adapter left some prompts unchanged: {changed}"
        assert by_adapter["rand-again"] == by_adapter["rand"]
