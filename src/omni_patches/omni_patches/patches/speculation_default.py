"""``_patch_cpu_speculation_default``: omni's gated prompt-lookup speculation on small machines by default.

vLLM 0.28 builds the speculative config in ``EngineArgs.create_speculative_config``
(``vllm/engine/arg_utils.py``), for ``vllm.LLM`` and ``vllm serve`` alike, from the engine arguments
only. No published hook sees those arguments with the model's config (the platform's parser hook
runs before the model is known, and cannot tell a pooling model or custom logits processors, which
vLLM refuses under speculation), so this patch does: where the user named no speculative config,
OmniPlatform is the platform, :func:`omni_platform.speculation.why_not` finds no reason against it and
vLLM's ``custom_class`` hook is the one the proposer was written for (``omni_platform.internals``,
``gated_proposer``),
the engine gets :func:`omni_platform.speculation.default_speculative_config` and one log line saying
what was chosen and how to override it (``OMNI_SPECULATION=off``, or any ``speculative_config``).
"""

from __future__ import annotations

import functools
import logging

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

logger = logging.getLogger("vllm.omni_patches.speculation_default")
NAME = "_patch_cpu_speculation_default"


def _make(original):
    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        from vllm.platforms import current_platform

        from omni_platform import envs, internals
        from omni_platform.platform import OmniPlatform, _allowed_physical_cores
        from omni_platform.speculation import CHOSEN_FROM, default_speculative_config, why_not

        if isinstance(current_platform, OmniPlatform):
            user = any(v is not None for v in (self.speculative_config, getattr(self, "spec_method", None),
                                               getattr(self, "spec_model", None), getattr(self, "spec_tokens", None)))
            reason = why_not(physical_cores=_allowed_physical_cores(), few_cpus=envs.OMNI_FEW_CPUS,
                             mode=envs.OMNI_SPECULATION, user_config=user,
                             logits_processors=bool(self.logits_processors),
                             runner_type=getattr(target_model_config, "runner_type", "generate"),
                             parallel=int(getattr(target_parallel_config, "tensor_parallel_size", 1) or 1)
                             * int(getattr(target_parallel_config, "pipeline_parallel_size", 1) or 1))
            if reason is None and not internals.holds("gated_proposer"):
                reason = "vLLM's custom_class proposer hook changed (omni_platform.internals logged what)"
            if reason is None:
                self.speculative_config = default_speculative_config(self.max_num_seqs)
                logger.info(
                    "omni-patches: speculative decoding (OMNI_SPECULATION=auto, the default): %s (small machine, "
                    "<= OMNI_FEW_CPUS=%d cores; chosen by %s); vLLM refuses min_p and logit_bias while it is on; "
                    "OMNI_SPECULATION=off or a speculative_config of your own overrides it",
                    self.speculative_config, envs.OMNI_FEW_CPUS, CHOSEN_FROM)
            elif not user:
                logger.info("omni-patches: no speculative decoding by default: %s", reason)
        return original(self, target_model_config, target_parallel_config)

    setattr(create_speculative_config, MARKER, NAME)
    return [create_speculative_config]


PATCH = Patch(
    name=NAME,
    targets={"vllm.engine.arg_utils:EngineArgs.create_speculative_config":
             "f64805340e5ddc727a94f7dd0b6fe1ec7c7508c7aa19de3650f54513bd622968"},
    make=_make,
    disable_env="OMNI_PATCH_SPECULATION_DEFAULT_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/engine/arg_utils.py:EngineArgs.create_speculative_config`',
    bug=("not a bug: omni's default (docs/speculation.md). vLLM builds the speculative config from the"
         " engine arguments alone, and no published hook sees them with the model's config; the "
         'replacement fills in `omni_platform.speculation.default_speculative_config` where the user '
         "named none and `why_not` finds no reason against it, logs it, and calls vLLM's own"),
    switch_doc='`OMNI_PATCH_SPECULATION_DEFAULT_OFF=1` (or `OMNI_SPECULATION=off`)',
    bug_test=('not a bug: '
              '`tests/test_patch_switches.py::test_speculation_default_off_leaves_the_engine_without_speculation`'
              ' (switched off: the engine config `vllm.LLM` builds has no speculative config); '
              '`tests/test_speculation_default.py::test_off_the_engine_does_not_speculate_and_says_why`'
              ' (OMNI_SPECULATION=off)'),
    fix_test=('the first test (the gated proposer through `custom_class`); in an engine '
              '`tests/test_speculation_default.py::test_by_default_an_engine_without_a_speculative_config_speculates_and_says_so`'),
)
