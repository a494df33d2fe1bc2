"""The order in which ``make test``'s xdist workers take the test modules: the longest first.

``make test`` runs each phase on two workers with ``--dist loadscope --no-loadscope-reorder``: a worker
takes one module at a time, in the order of the collected items. xdist's own reordering (the default)
starts the modules with the most tests first, so a module of one long test (C27, three thousand requests)
could start last and run alone while the other worker idled. Starting the longest first (the classic
longest-processing-time rule) leaves short modules to fill in at the end.

``MODULE_SECONDS``: each module's setup + call + teardown seconds summed over ``make test``'s phases on a
2-core AVX-512 EPYC: the larger of 2026-12-05's sum (``pytest --durations=0``) and 2026-12-07's sum over the
module's tests among each phase's 60 slowest (``PYTEST_ARGS=--durations=60 bash .ci/run``; a lower bound).
Modules under 10 s are left out and keep their collection order after these. The figures only order the
modules: a stale one costs minutes of suite time, never a result.
"""

from __future__ import annotations

__all__ = ["MODULE_SECONDS", "longest_first"]

MODULE_SECONDS: dict[str, float] = {
    "test_mapped_weights.py": 312,
    "test_speculation.py": 287,
    "test_request_memory.py": 224,
    "test_patches_engine.py": 188,
    "test_harness_grid.py": 165,
    "test_compile_cache_key.py": 144,
    "test_info.py": 133,
    "test_quant_engine.py": 131,
    "test_scale_out.py": 129,
    "test_compile_ahead.py": 127,
    "test_lifeline.py": 127,
    "test_gguf_blocks.py": 113,
    "test_startup.py": 112,
    "test_gguf_convert.py": 111,
    "test_architectures.py": 107,
    "test_wheels.py": 106,
    "test_streaming_calibration.py": 99,
    "test_bench_e2e.py": 95,
    "test_patches_guards.py": 95,
    "test_attention_one_op.py": 91,
    "test_convert.py": 91,
    "test_real_engine.py": 90,
    "test_fused_engine.py": 81,
    "test_batch_invariance.py": 76,
    "test_patches_off.py": 67,
    "test_cache_root.py": 65,
    "test_patch_switches.py": 53,
    "test_embedding_engine.py": 51,
    "test_patch_embedding_gemm_copy.py": 45,
    "test_provenance.py": 44,
    "test_served_requests.py": 44,
    "test_request_checks.py": 43,
    "test_fuzz_openai.py": 40,
    "test_patches_status.py": 39,
    "test_soak.py": 39,
    "test_sampler_seeds.py": 37,
    "test_speculation_default.py": 36,
    "test_kv_lazy_pages.py": 34,
    "test_patch_modelinfo_in_process.py": 34,
    "test_layout_guard.py": 32,
    "test_models.py": 31,
    "test_gptq_writer.py": 28,
    "test_gguf_reading.py": 27,
    "test_kv_budget.py": 27,
    "test_lora.py": 27,
    "test_seeded_prefill.py": 26,
    "test_paired.py": 24,
    "test_internals.py": 19,
    "test_patch_modelinfo_cache.py": 19,
    "test_spec_structured.py": 17,
    "test_prompt_logprobs_memory.py": 16,
    "test_sigterm_drain.py": 15,
    "test_tool_calls.py": 13,
    "test_tokenizer_pool.py": 10,
}


def longest_first(items: list) -> None:
    """Sort pytest ``items`` in place by their module's :data:`MODULE_SECONDS`, longest first; a stable sort,
    so tests keep their order inside a module and unlisted modules keep theirs after the listed ones."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0.0))
