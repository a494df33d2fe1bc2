"""``_patch_cpu_pipeline_parallel_eager``: ``pipeline_parallel_size > 1`` on CPU in eager mode.

Upstream behaviour (vLLM 0.28.0): a pipeline stage after the first receives the previous
stage's hidden states into ``GPUModelRunner.intermediate_tensors``, a buffer that only
``_dummy_run`` allocates (``vllm/v1/worker/gpu_model_runner.py``). On CPU the dummy run is
the compiled-mode warm-up (``CPUModelRunner.warming_up_model``,
``vllm/v1/worker/cpu_model_runner.py``), which returns at once in eager mode
(``CompilationMode.NONE``): the first request then fails in every later stage with
``assert self.intermediate_tensors is not None`` (C17, docs/cases.md). The replacement
allocates the buffer as ``_dummy_run`` does (``make_empty_intermediate_tensors`` with
``max_num_tokens`` rows, the model dtype) after the original warm-up, on every stage but
the first, when it is still missing.
"""

from __future__ import annotations

import functools
import logging

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

logger = logging.getLogger("vllm.omni_patches.pipeline_parallel")
NAME = "_patch_cpu_pipeline_parallel_eager"


def _make(warming_up_model):
    @functools.wraps(warming_up_model)
    def wrapper(self, *args, **kwargs):
        result = warming_up_model(self, *args, **kwargs)
        from vllm.distributed.parallel_state import get_pp_group

        if not get_pp_group().is_first_rank and getattr(self, "intermediate_tensors", None) is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
            logger.info("omni-patches: pipeline stage %d: intermediate tensors for %d tokens allocated "
                        "(eager mode has no warm-up run to do it)", get_pp_group().rank_in_group, self.max_num_tokens)
        return result

    setattr(wrapper, MARKER, NAME)
    return [wrapper]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model":
             "5191f2b6fbd5da013dc2a2c94e9ade471ee31ab6d61e3aa175c37b495db100bd"},
    make=_make,
    disable_env="OMNI_PATCH_PIPELINE_PARALLEL_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/v1/worker/cpu_model_runner.py:CPUModelRunner.warming_up_model`',
    bug=('later pipeline stages receive hidden states into a buffer only the compiled-mode warm-up '
         'allocates: `pipeline_parallel_size=2` in eager mode fails at the first request (C17)'),
    switch_doc='`OMNI_PATCH_PIPELINE_PARALLEL_OFF=1`',
    bug_test=('`tests/test_patches_off.py::test_c17_pipeline_parallel_off_a_later_stage_fails_at_its_first_request_in_eager_mode`'
              " (the runner of a later stage, vLLM's pipeline group replaced by a stand-in: after the "
              "eager warm-up vLLM's own `assert self.intermediate_tensors is not None` fails); in an "
              'engine `tests/test_patches_engine.py::test_c17_pipeline_parallel_bug_without_the_patch`'
              ' (skipped with fewer than two CPUs)'),
    fix_test='the first test; in an engine `tests/test_scale_out.py::test_c17_pp2_greedy_equals_pp1`',
)
