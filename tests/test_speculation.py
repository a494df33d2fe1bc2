"""Speculative decoding gives the tokens of plain greedy decoding (issue 33), for every method vLLM 0.28
runs on CPU without a trained head: ``ngram`` (prompt lookup), ``suffix`` (arctic-inference's suffix
trees), ``draft_model`` and omni's gated prompt lookup, eager and compiled, on the real SmolLM2 int4 and on a tiny
cpu_int4 model (compiled SmolLM2 runs the gated default only: ``text_methods``).

A verify step scores 1 + k tokens of one request at once; the plain run scores one. Equal tokens mean the
verify rows compute what the one-row decode computes (omni's W4A8 kernel per row, vLLM's attention
without its KV split: ``VLLM_CPU_ATTN_SPLIT_KV=0``, tests/test_batch_invariance.py). Each run also shows
that speculation happened (vLLM's own counters: drafts proposed, tokens accepted), so equality is not
the trivial equality of an engine that never speculated.

Both runs set ``OMNI_INT4_DEQUANT_MIN_ROWS=8``, so on every CPU a request of 8 rows or more takes the
kernel's prefill path (dequantize + bf16 GEMM), as an AMX machine measures for itself: a suffix
verify step (up to 25 rows) must still take the W4A8 kernel (``kernel_choice.choose``'s floor), or
greedy tokens change (CI, on a CPU whose measured row count was below a verify step's rows).

SmolLM2's draft model is its bf16 checkpoint (different numerics from the int4 target: real rejections);
the tiny model drafts for itself in its own cpu_int4 form, built under vLLM's ``draft_model.`` prefix
(the checkpoint-name mapping of ``CpuInt4Config.checkpoint_prefix``).
"""

import pytest

from conftest import clean_env, run_engine

MiB = 1 << 20
PREFILL_PATH_FROM = {"OMNI_INT4_DEQUANT_MIN_ROWS": "8"}  # below suffix decoding's verify rows, above ngram's k=4
TEXT_PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
                "# the same function, with a comment on every line:\n",
                "List the numbers from 1 to 40, separated by commas: 1, 2, 3,", "Once upon a time"]
TINY_PROMPTS = [[(7 * i) % 500 + 3 for i in range(24)] * 3, [11, 12, 13, 14, 15] * 8, [300, 200, 100, 50]]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix"}
GATED = {"method": "custom_class", "model": "omni_platform.spec_proposer.GatedPromptLookup",
         "num_speculative_tokens": 8}
METHODS = ("ngram", "suffix", "draft_model", "gated")
VLLM_METHOD = {"gated": "custom_class"}  # what vLLM's config calls omni's gated prompt lookup


@pytest.fixture(scope="session")
def tiny_int4(tiny_llama, tmp_path_factory):
    """The tiny Llama in cpu_int4 with the q4k recipe: down_proj (K = 256) in super-blocks, the rest per group."""
    from omni_quant.conversion.checkpoint import convert

    dst = tmp_path_factory.mktemp("tiny-q4k") / "ckpt"
    convert(tiny_llama, dst, recipe="q4k")
    return dst


def _runs(smollm2, smollm2_draft, tiny, eager):
    def text(**kw):
        return {"llm": {"model": str(smollm2), "enforce_eager": eager, "max_model_len": 512, "max_num_seqs": 4,
                        "kv_cache_memory_bytes": 128 * MiB, **kw},
                "prompts": TEXT_PROMPTS, "max_tokens": 96, "spec_counters": True}

    def tok(**kw):
        return {"llm": {"model": str(tiny), "enforce_eager": eager, "max_model_len": 256, "max_num_seqs": 4,
                        "kv_cache_memory_bytes": 32 * MiB, "skip_tokenizer_init": True, **kw},
                "prompts": TINY_PROMPTS, "max_tokens": 64, "spec_counters": True}

    specs = {"ngram": NGRAM, "suffix": SUFFIX, "gated": GATED,
             "draft_model": {"method": "draft_model", "model": str(smollm2_draft), "num_speculative_tokens": 3}}
    tiny_specs = {**specs, "draft_model": {"method": "draft_model", "model": str(tiny), "num_speculative_tokens": 3}}
    def alone(cfg, method):  # the gated proposer drafts only while one request decodes: its prompts also alone
        return {**cfg, "also_alone": True} if method == "gated" else cfg

    return {"runs": [text(), *(alone(text(speculative_config=specs[m]), m) for m in text_methods(eager)),
                     tok(), *(alone(tok(speculative_config=tiny_specs[m]), m) for m in METHODS)]}


def text_methods(eager: bool) -> tuple[str, ...]:
    """SmolLM2's methods: all eager; compiled, the shipped default (``gated``) only: each compiled SmolLM2 engine
    costs about 40 s on two cores, and ``draft_model`` compiles two models cold (about two minutes). The tiny
    model's compiled runs cover every method, a compiled drafter included."""
    return METHODS if eager else ("gated",)


def _check(result, eager):
    runs = result["runs"]
    smollm2 = text_methods(eager)
    assert len(runs) == 2 + len(smollm2) + len(METHODS)
    for model, base, methods in (("SmolLM2 int4", 0, smollm2), ("tiny cpu_int4", 1 + len(smollm2), METHODS)):
        plain = runs[base]
        assert plain["speculative"] is None
        for i, method in enumerate(methods, start=1):
            spec = runs[base + i]
            where = f"{model}, {method}, {'eager' if eager else 'compiled'}"
            assert spec["speculative"]["method"] == VLLM_METHOD.get(method, method), where
            assert spec["spec_counters"]["drafts"] > 0, f"{where}: never speculated"
            assert spec["token_ids"] == plain["token_ids"], f"{where}: speculation changed greedy tokens"
            if spec["alone_token_ids"] is not None:
                assert spec["alone_token_ids"] == plain["token_ids"], f"{where}: alone, speculation changed tokens"
    if "draft_model" in smollm2:  # SmolLM2's draft model is its bf16 form: the int4 target rejects some drafts
        draft = runs[smollm2.index("draft_model") + 1]["spec_counters"]
        assert 0 < draft["accepted_tokens"] < draft["draft_tokens"]


@pytest.mark.engine
def test_speculation_gives_the_plain_tokens_eager(int4_model_dir, real_model, tiny_int4):
    """Eager, the gated proposer drafts by fresh lookups (``OMNI_SPEC_FOLLOW_EDITS=0``, the opt-out); compiled
    (below) it runs the shipped default, following copies through edits."""
    result = run_engine(_runs(int4_model_dir, real_model, tiny_int4, eager=True),
                        clean_env(VLLM_PLUGINS="omni", OMNI_SPECULATION="off", OMNI_SPEC_FOLLOW_EDITS="0",
                                  **PREFILL_PATH_FROM))
    _check(result, eager=True)


@pytest.mark.engine
def test_speculation_gives_the_plain_tokens_compiled(int4_model_dir, real_model, tiny_int4, tmp_path):
    result = run_engine(_runs(int4_model_dir, real_model, tiny_int4, eager=False),
                        clean_env(VLLM_PLUGINS="omni", OMNI_SPECULATION="off", VLLM_CACHE_ROOT=str(tmp_path),
                                  **PREFILL_PATH_FROM),
                        timeout=1500)
    _check(result, eager=False)


def test_a_draft_models_layers_find_their_checkpoint_names():
    from omni_quant.runtime.config import CpuInt4Config

    cfg = CpuInt4Config.from_config({
        "quant_method": "cpu_int4", "bits": 4, "group_size": 32, "pack_format": "nibbles_low_first",
        "format_version": 4, "group_size_per_module": {"model.layers.0.mlp.down_proj": 32, "lm_head": 32,
                                                       "model.layers.0.self_attn.q_proj": 32},
        "super_block_modules": ["model.layers.0.mlp.down_proj"]})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert cfg.checkpoint_prefix("draft_model.model.layers.0.mlp.down_proj") == "model.layers.0.mlp.down_proj"
    assert cfg.super_blocks_for(cfg.checkpoint_prefix("draft_model.model.layers.0.mlp.down_proj"))
    assert cfg.checkpoint_prefix("draft_model.lm_head") == "lm_head"
    assert cfg.checkpoint_prefix("draft_model.model.layers.0.self_attn.qkv_proj") == "model.layers.0.self_attn.qkv_proj"
    assert cfg.checkpoint_prefix("model.layers.0.mlp.down_proj") == "model.layers.0.mlp.down_proj"
    assert cfg.checkpoint_prefix("model.layers.7.mlp.up_proj") == "model.layers.7.mlp.up_proj"  # unknown: as given
