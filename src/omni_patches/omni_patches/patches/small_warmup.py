"""``_patch_cpu_small_warmup``: a warm start runs a 16-token warm-up, not a full prefill.

Upstream behaviour (vLLM 0.28.0, ``vllm/v1/worker/cpu_model_runner.py``,
``CPUModelRunner.warming_up_model``): in compiled mode the CPU worker's warm-up is
``GPUModelRunner.profile_run`` (``vllm/v1/worker/gpu_model_runner.py``): a dummy forward of
``max_num_tokens`` rows (512 on a small machine), a sampler pass over them and a full
``gc.collect()``. The first call of the compiled model inside it either traces and compiles
(a cold start: the trace at the largest size is the "generic shape" vLLM wants) or loads the
saved AOT artifact (a warm start). On a warm start nothing is left to compile: the 512-row
forward is a real prefill of dummy tokens, the largest part of the warm-up on Qwen2.5-Coder-1.5B int4
(docs/startup.md gives the start-up profiles before and after).

The replacement finds the AOT artifact the compiled model will load, at the path vLLM's
``_support_torch_compile.__call__`` computes (``vllm/compilation/decorators.py``:
``VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256 of aot_compile_hash_factors +
_model_hash_key(forward)>/rank_R_D/model``). When that file exists it runs the same dummy forward
and sampler pass with :data:`WARMUP_TOKENS` rows: the artifact is loaded and run once, as before,
without the prefill. Anything else (no artifact yet, a cold start, caching off, the AOT-load patch
off, a multimodal or pooling model, pipeline parallelism) runs vLLM's warm-up unchanged. If the
artifact was expected but vLLM did not load it (a corrupt file: vLLM then compiles), a warning
says the graph was traced at the small size.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "WARMUP_TOKENS", "aot_artifact_paths"]

logger = logging.getLogger("vllm.omni_patches.small_warmup")
NAME = "_patch_cpu_small_warmup"

AOT_LOAD_PATCH = "_patch_cpu_aot_compile_cache_load"
"""Without it vLLM 0.28 cannot load the artifact on CPU (aot_cache.py): the short warm-up needs it applied."""

WARMUP_TOKENS = 16
"""Rows of the warm-up's dummy forward when the compiled model is loaded, not compiled."""


def aot_artifact_paths(runner) -> list[str]:
    """The AOT artifact path of each ``@support_torch_compile`` module in ``runner.model``.

    Computed as ``_support_torch_compile.__call__`` computes it (vLLM 0.28.0,
    ``vllm/compilation/decorators.py``). Empty when AOT compile or the compile cache is off,
    or when the model has no compiled module.
    """
    import vllm.envs as vllm_envs
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.compilation.decorators import _model_hash_key

    if not vllm_envs.VLLM_USE_AOT_COMPILE or vllm_envs.VLLM_DISABLE_COMPILE_CACHE:
        return []
    config = runner.vllm_config
    parallel = config.parallel_config
    paths = []
    for module in runner.model.modules():
        if getattr(module, "do_not_compile", True):  # set by the decorator's __init__; absent elsewhere
            continue
        factors = list(aot_compile_hash_factors(config))
        factors.append(_model_hash_key(module.forward))
        key = hashlib.sha256(str(factors).encode()).hexdigest()
        paths.append(os.path.join(vllm_envs.VLLM_CACHE_ROOT, "torch_compile_cache", "torch_aot_compile", key,
                                  f"rank_{parallel.rank}_{parallel.data_parallel_index}", "model"))
    return paths


def _single_stage_text_model(runner) -> bool:
    """A text-only generative model in one pipeline stage: the case the short warm-up covers."""
    from vllm.distributed.parallel_state import get_pp_group

    return not runner.supports_mm_inputs and not runner.is_pooling_model and get_pp_group().world_size == 1


def _make(warming_up_model):
    @functools.wraps(warming_up_model)
    def wrapper(self, *args, **kwargs):
        from vllm.config import CompilationMode

        if self.vllm_config.compilation_config.mode == CompilationMode.NONE or not _single_stage_text_model(self):
            return warming_up_model(self, *args, **kwargs)
        from omni_patches._registry import applied_patches

        if AOT_LOAD_PATCH not in applied_patches():  # on CPU vLLM's own load fails: the warm-up compiles
            return warming_up_model(self, *args, **kwargs)
        paths = aot_artifact_paths(self)
        if not paths or not all(os.path.isfile(p) for p in paths):
            return warming_up_model(self, *args, **kwargs)
        from vllm.compilation.counter import compilation_counter
        from vllm.v1.worker.cpu_model_runner import _set_global_compilation_settings

        tokens = min(WARMUP_TOKENS, self.max_num_tokens)
        loaded_before = compilation_counter.num_aot_artifacts_loaded
        logger.info("omni-patches: warming up the compiled model from its AOT artifact with %d tokens instead of "
                    "%d (nothing to compile; OMNI_PATCH_SMALL_WARMUP_OFF=1 runs vLLM's full warm-up)",
                    tokens, self.max_num_tokens)
        with _set_global_compilation_settings(self.vllm_config):
            hidden_states, last_hidden_states = self._dummy_run(tokens, is_profile=True)
            output = self._dummy_sampler_run(last_hidden_states)
        del hidden_states, last_hidden_states, output
        if compilation_counter.num_aot_artifacts_loaded == loaded_before:
            logger.warning("omni-patches: the AOT artifact %s was not loaded (vLLM compiled instead, see above); the "
                           "graph was traced from a %d-token warm-up. Remove the file, or set "
                           "OMNI_PATCH_SMALL_WARMUP_OFF=1, to trace at %d tokens", paths[0], tokens,
                           self.max_num_tokens)
        logger.info("Warming up done.")
        return None

    setattr(wrapper, MARKER, NAME)
    return [wrapper]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model":
             "5191f2b6fbd5da013dc2a2c94e9ade471ee31ab6d61e3aa175c37b495db100bd"},
    make=_make,
    disable_env="OMNI_PATCH_SMALL_WARMUP_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/v1/worker/cpu_model_runner.py:CPUModelRunner.warming_up_model`',
    bug=('not a bug: in compiled mode the CPU warm-up is `profile_run`, a dummy prefill of '
         '`max_num_tokens` rows (512) and a sampler pass, whose purpose is to trace and compile; a '
         'warm start that loads the saved AOT artifact has nothing to compile and still runs the '
         'prefill (docs/startup.md says what it costs). The replacement runs the same dummy forward '
         'and sampler pass with 16 rows when the artifact vLLM will load exists (and '
         '`_patch_cpu_aot_compile_cache_load` is applied); a cold start is unchanged. It wraps the '
         "pipeline-parallel patch's target too: `apply_all` passes a later patch of a target the "
         'earlier replacement'),
    switch_doc='`OMNI_PATCH_SMALL_WARMUP_OFF=1`',
    bug_test=('`tests/test_patches_engine.py::test_aot_compile_cache_second_start_loads_instead_of_recompiling`'
              " (engine: its fifth start, with the switch set, loads the artifact and runs vLLM's full"
              ' warm-up)'),
    fix_test=("the same test's third start logs the 16-token warm-up and the same tokens; its cold and"
              ' unpatched starts do not take it; '
              '`tests/test_patches_guards.py::test_two_patches_of_one_target_compose_and_a_second_apply_adds_no_layer`'),
)
