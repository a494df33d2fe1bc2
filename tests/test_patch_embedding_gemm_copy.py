"""_patch_cpu_embedding_gemm_copy in an engine: vLLM 0.28 packs a GEMM copy of every unquantized input
embedding on CPU; with the patch only a module that computes logits gets one, at its first use."""

import pytest
import torch

from conftest import clean_env, run_engine

pytestmark = pytest.mark.engine

MiB = 1 << 20


def _run(model, prompts, **env):
    config = {"llm": {"model": str(model), "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 2},
              "prompts": prompts, "max_tokens": 8, "ledger": True, "prompt_logprobs": True}
    return run_engine(config, clean_env(VLLM_PLUGINS="omni", **env))


@pytest.fixture(scope="module")
def smollm2_runs(real_model):
    """SmolLM2-135M in bf16: its head is a ParallelLMHead tied to the embedding (it packs its own copy)."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    return {"on": _run(real_model, prompts), "off": _run(real_model, prompts, OMNI_PATCH_EMBEDDING_GEMM_COPY_OFF="1")}


def test_without_the_patch_the_input_embedding_holds_a_packed_copy(smollm2_runs):
    table = 49152 * 576 * 2  # SmolLM2's embedding, bf16 bytes
    (on,), (off,) = smollm2_runs["on"]["ledgers"], smollm2_runs["off"]["ledgers"]
    extra = off["malloc"]["in_use"] - on["malloc"]["in_use"]
    assert extra >= 0.9 * table, f"malloc in use grows by {extra / MiB:.1f} MiB without the patch"
    assert off["rss_anon"] - on["rss_anon"] >= 0.8 * table, (off["rss_anon"], on["rss_anon"])


def test_with_the_patch_the_same_tokens_and_logprobs(smollm2_runs):
    assert smollm2_runs["on"]["token_ids"] == smollm2_runs["off"]["token_ids"]
    assert smollm2_runs["on"]["prompt_logprobs"] == smollm2_runs["off"]["prompt_logprobs"]


def test_a_model_whose_logits_come_from_its_embedding_module_gets_the_gemm_at_first_use(tmp_path):
    """Gemma computes its logits with ``model.embed_tokens`` itself: the packed GEMM is built at the first
    logits call, and every log-probability equals the unpatched engine's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("gemma", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                               num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, head_dim=32,
                               max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "gemma")
    prompts = [[1, 17, 42, 99, 7, 300, 5, 12], [1, 250, 3, 8, 91, 77, 450, 6]]
    on = _run(tmp_path / "gemma", prompts)
    off = _run(tmp_path / "gemma", prompts, OMNI_PATCH_EMBEDDING_GEMM_COPY_OFF="1")
    assert "_patch_cpu_embedding_gemm_copy" in on["workers"][0]["extension_reports"]["patches"]["applied"]
    assert "_patch_cpu_embedding_gemm_copy" not in off["workers"][0]["extension_reports"]["patches"]["applied"]
    assert on["token_ids"] == off["token_ids"] and all(len(t) == 8 for t in on["token_ids"])
    assert on["prompt_logprobs"] == off["prompt_logprobs"]
