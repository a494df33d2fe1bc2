"""The order in which ``make test``'s xdist workers take the test modules: the longest first.

``make test`` runs each phase on two workers with ``--dist loadscope --no-loadscope-reorder``: a worker
takes one module at a time, in the order of the collected items. xdist's own reordering (the default)
starts the modules with the most tests first, so a module of one long test (C27, three thousand requests)
could start last and run alone while the other worker idled. Starting the longest first (the classic
longest-processing-time rule) leaves short modules to fill in at the end.

``MODULE_SECONDS``: each module's setup + call + teardown seconds summed over ``make test``'s phases
(``pytest --durations=0``) on a 2-core AVX-512 EPYC on 2026-12-05; modules under 10 s are left out and
keep their collection order after these. The figures only order the modules: a stale one costs minutes of
suite time, never a result.
"""

from __future__ import annotations

__all__ = ["MODULE_SECONDS", "longest_first"]

MODULE_SECONDS: dict[str, float] = {
    "test_speculation.py": 210,
    "test_request_memory.py": 185,
    "test_mapped_weights.py": 180,
    "test_harness_grid.py": 165,
    "test_patches_engine.py": 147,
    "test_gguf_convert.py": 111,
    "test_wheels.py": 106,
    "test_streaming_calibration.py": 99,
    "test_info.py": 99,
    "test_lifeline.py": 94,
    "test_startup.py": 81,
    "test_real_engine.py": 80,
    "test_quant_engine.py": 79,
    "test_architectures.py": 79,
    "test_attention_one_op.py": 77,
    "test_bench_e2e.py": 77,
    "test_batch_invariance.py": 73,
    "test_convert.py": 70,
    "test_patches_guards.py": 66,
    "test_embedding_engine.py": 51,
    "test_patches_off.py": 49,
    "test_patch_embedding_gemm_copy.py": 42,
    "test_fuzz_openai.py": 40,
    "test_patches_status.py": 39,
    "test_sampler_seeds.py": 37,
    "test_soak.py": 37,
    "test_gguf_blocks.py": 37,
    "test_request_checks.py": 34,
    "test_speculation_default.py": 32,
    "test_provenance.py": 32,
    "test_models.py": 31,
    "test_kv_budget.py": 27,
    "test_seeded_prefill.py": 26,
    "test_lora.py": 24,
    "test_cache_root.py": 24,
    "test_patch_modelinfo_in_process.py": 23,
    "test_compile_cache_key.py": 23,
    "test_gptq_writer.py": 22,
    "test_patch_modelinfo_cache.py": 16,
    "test_prompt_logprobs_memory.py": 15,
    "test_sigterm_drain.py": 14,
    "test_spec_structured.py": 13,
}


def longest_first(items: list) -> None:
    """Sort pytest ``items`` in place by their module's :data:`MODULE_SECONDS`, longest first; a stable sort,
    so tests keep their order inside a module and unlisted modules keep theirs after the listed ones."""
    items.sort(key=lambda item: -MODULE_SECONDS.get(item.path.name, 0.0))
