"""The patches whose bug is shown here with their own switch set (``OMNI_PATCH_*_OFF=1``, every other patch
on), and its absence with every patch on: the speculation expand kernel (C25), the detokenizer's prompt
ending mid-character (C23), the processor probe, the speculation default, LoRA on quantized embeddings (C19).

Each probe is one interpreter that applies the patches as vLLM's plugin loader does (``apply_all``) and calls
the patched vLLM code directly: no engine, except for LoRA, whose bug is an engine that does not start.
docs/stability.md lists, per patch, the test that shows its bug.
"""

import functools
import textwrap

import pytest

from conftest import clean_env, run_engine, run_probe
from skips import MORE_CORES_THAN_FEW

PROBE = textwrap.dedent("""
    import json, sys, types
    import torch
    from omni_patches import apply_all
    applied = apply_all()
    tiny, smol = sys.argv[1], sys.argv[2]
    out = {"applied": applied}

    # C25: the rejection sampler's expansion of per-request values into a float32 tensor
    from vllm.utils.cpu_triton_utils import expand_kernel
    temperature = torch.full((5,), -1.0)
    expand_kernel.func(temperature, torch.tensor([0.7, 1.3]), torch.tensor([2, 5]), 0, 1)
    out["expanded"] = [round(v, 4) for v in temperature.tolist()]

    # C23: a token prompt ending inside a multi-byte character, then the tokens that complete it and more
    from transformers import AutoTokenizer
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers.registry import get_tokenizer
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
    hf = AutoTokenizer.from_pretrained(smol)
    ids = hf.encode("日本語のテキスト")
    cut = next(n for n in range(3, len(ids)) if hf.decode(ids[:n]).endswith("\\ufffd"))
    request = types.SimpleNamespace(request_id="r", prompt_token_ids=ids[:cut], sampling_params=SamplingParams(
        max_tokens=8, skip_special_tokens=True), arrival_time=0.0, lora_request=None)
    detok = FastIncrementalDetokenizer(get_tokenizer(smol), request)
    out["detokenized"] = "".join(detok.decode_next(t) or "" for t in ids[cut:])
    out["prompt_text"] = hf.decode(ids[:cut - 1])
    out["rest_text"] = hf.decode(ids)[len(hf.decode(ids[:cut - 1])):]

    # the processor probe: how often the renderer loads a processor to find SmolLM2's chat template
    from vllm.renderers import hf as renderers_hf
    loads = []
    original_get = renderers_hf.cached_get_processor
    def counted(*args, **kwargs):
        loads.append(args[0] if args else kwargs)
        return original_get(*args, **kwargs)
    renderers_hf.cached_get_processor = counted
    renderers_hf._PROCESSOR_CHAT_TEMPLATES.clear()
    template = renderers_hf._try_get_processor_chat_template(hf, revision=None, code_revision=None,
                                                             trust_remote_code=False)
    out["processor"] = {"template": template, "loads": len(loads)}

    # the speculation default: the engine config vllm.LLM builds for the tiny Llama
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    config = EngineArgs(model=tiny, skip_tokenizer_init=True, enforce_eager=True, max_model_len=256,
                        dtype="float32", kv_cache_memory_bytes=64 << 20).create_engine_config(UsageContext.LLM_CLASS)
    spec = config.speculative_config
    out["speculation"] = None if spec is None else {"method": spec.method, "model": spec.model}
    print("PROBE " + json.dumps(out), flush=True)
""")


@pytest.fixture(scope="module")
def probe(tiny_llama, int4_model_dir):
    """``probe(switch)``: the probe's result with ``switch=1`` (None: every patch on); each run once."""
    @functools.cache
    def run(switch: str | None) -> dict:
        env = clean_env(VLLM_PLUGINS="omni", **({switch: "1"} if switch else {}))
        return run_probe(PROBE, [str(tiny_llama), str(int4_model_dir)], env)

    return run


def _off(probe, switch: str, name: str) -> dict:
    off = probe(switch)
    assert name not in off["applied"] and name in probe(None)["applied"], off["applied"]
    return off


def test_c25_spec_expand_off_leaves_the_float_temperatures_unwritten(probe):
    off = _off(probe, "OMNI_PATCH_SPEC_EXPAND_OFF", "_patch_cpu_spec_expand_kernel")
    assert off["expanded"] == [-1.0] * 5, "vLLM's kernel wrote into an int64 copy, not the caller's tensor"
    assert probe(None)["expanded"] == [0.7, 0.7, 1.3, 1.3, 1.3]


def test_c23_detokenizer_off_puts_the_prompts_text_in_the_output(probe):
    off = _off(probe, "OMNI_PATCH_DETOKENIZER_TAIL_OFF", "_patch_detokenizer_prompt_mid_character")
    assert off["prompt_text"] and off["detokenized"].startswith(off["prompt_text"]), off
    on = probe(None)
    assert on["detokenized"] == on["rest_text"] and not on["detokenized"].startswith(on["prompt_text"]), on


def test_processor_probe_off_loads_a_processor_for_a_text_only_model(probe):
    """Not a bug: the load's cost. Both answer None; the patch answers without loading."""
    off = _off(probe, "OMNI_PATCH_PROCESSOR_PROBE_OFF", "_patch_text_model_processor_probe")
    assert off["processor"] == {"template": None, "loads": 1}
    assert probe(None)["processor"] == {"template": None, "loads": 0}


def test_speculation_default_off_leaves_the_engine_without_speculation(probe):
    MORE_CORES_THAN_FEW.skip_if_holds()  # the default applies on machines with <= OMNI_FEW_CPUS cores
    off = _off(probe, "OMNI_PATCH_SPECULATION_DEFAULT_OFF", "_patch_cpu_speculation_default")
    assert off["speculation"] is None
    assert probe(None)["speculation"] == {"method": "custom_class",
                                          "model": "omni_platform.spec_proposer.GatedPromptLookup"}


@pytest.mark.engine
def test_c19_lora_embedding_off_a_lora_engine_on_cpu_int4_does_not_start(int4_model_dir):
    """With the patch on, tests/test_lora.py runs adapters on this base."""
    config = {"llm": {"model": str(int4_model_dir), "max_model_len": 256, "enforce_eager": True,
                      "enable_lora": True, "max_lora_rank": 8, "max_loras": 1}, "prompts": ["Hi"], "max_tokens": 2}
    with pytest.raises(AssertionError, match="AttributeError") as failed:
        run_engine(config, clean_env(VLLM_PLUGINS="omni", OMNI_PATCH_LORA_EMBEDDING_OFF="1"), timeout=300)
    assert "weight" in str(failed.value)
