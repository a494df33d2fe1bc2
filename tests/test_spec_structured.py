"""C25: speculative decoding with structured output, greedy and sampled requests in one batch.

vLLM 0.28's CPU ``expand_kernel`` left the rejection sampler's per-token temperature/top-k/top-p unwritten
whenever the batch was not all greedy (``_patch_cpu_spec_expand_kernel``); a greedy request with a grammar then
drew token 0, which the grammar rejected, and vLLM ended it with ``finish_reason`` "error"."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conftest import clean_env, run_engine

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
PHONE = r"\d{3}-\d{3}-\d{4}"
ANIMALS = r"(cat|dog)( (cat|dog)){5}"
PROMPTS = ["name: Bob, age: 31. name: Bob, age: 31. name: Bob, age: 31. As JSON: ",
           "The phone numbers are 555-123-4567 and 555-123-4567 and 555-123-",
           "Repeat: cat dog cat dog cat dog cat dog cat dog"]
GRAMMARS = [{"json": SCHEMA}, {"regex": PHONE}, {"regex": ANIMALS}]


def test_the_expansion_writes_every_dtype_into_the_callers_tensor():
    from omni_patches.patches.spec_expand import expand_into

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    temperature = torch.full((5,), -7.0)
    expand_into(temperature, torch.tensor([0.8, 0.5, 0.0]), cu, 0, 1)
    assert temperature.tolist() == pytest.approx([0.8, 0.8, 1.0, 1.0, 1.0])
    top_k = torch.full((6,), -7, dtype=torch.int32)
    expand_into(top_k, torch.tensor([5, 9, 50], dtype=torch.int32), cu, 0, 0)
    assert top_k.tolist() == [5, 5, 50, 50, 50, -7]  # rows past the last request's tokens untouched


def test_vllms_cpu_expansion_leaves_a_float_output_unwritten():
    """The upstream fault the patch answers (fails the day vLLM writes the caller's tensor; the patch's
    fingerprint guard fires then too)."""
    import vllm._C  # noqa: F401  (registers torch.ops._C)
    from vllm.utils.cpu_triton_utils import _expand_kernel_impl

    out = torch.full((5,), -7.0)
    _expand_kernel_impl(out, torch.tensor([0.8, 0.5, 0.0]), torch.tensor([2, 2, 5]), 0, 1)
    assert out.tolist() == [-7.0] * 5


@pytest.mark.engine
def test_c25_structured_output_under_speculation_keeps_every_grammar(int4_model_dir):
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    per_prompt = [{"temperature": t, "seed": 1, "structured_outputs": g} for t in (0.0, 0.8) for g in GRAMMARS]
    run = run_engine({"runs": [{
        "llm": {"model": str(int4_model_dir), "max_model_len": 512, "enforce_eager": True, "speculative_config": spec},
        "prompts": PROMPTS * 2, "per_prompt": per_prompt, "max_tokens": 48, "spec_counters": True}]},
        clean_env(VLLM_PLUGINS="omni"))
    result = run["runs"][0]
    assert result["spec_counters"]["drafts"] > 0, "nothing was speculated"
    assert "grammar rejected" not in run.log
    assert result["finish_reasons"] == ["stop"] * 6, list(zip(result["texts"], result["finish_reasons"], strict=True))
    for text, overrides in zip(result["texts"], per_prompt, strict=True):
        grammar = overrides["structured_outputs"]
        if "json" in grammar:
            value = json.loads(text)
            assert set(value) == {"name", "age"} and isinstance(value["age"], int), text
        else:
            assert re.fullmatch(grammar["regex"], text), (grammar["regex"], text)
