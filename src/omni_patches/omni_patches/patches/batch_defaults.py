"""``_patch_cpu_small_machine_batch_defaults``: omni's step budget for ``vllm.LLM`` on small machines.

vLLM 0.28 gives ``vllm.LLM`` on CPU ``max_num_batched_tokens=4096`` and
``max_num_seqs=256`` when the user sets neither (``EngineArgs.get_batch_defaults``,
``vllm/engine/arg_utils.py``). In compiled mode both size the start-up: the warm-up
forward runs ``max_num_batched_tokens`` tokens and the sampler warm-up
``max_num_seqs`` x vocabulary rows, twice. The CLI gets omni's smaller defaults through
the platform's published parser hook; ``vllm.LLM`` passes its keyword arguments to no
published hook, so this patch makes ``get_batch_defaults`` answer with
``omni_platform.layout.small_machine_batch_defaults`` for every usage context. vLLM
still applies them only where the user left the value unset (``None``), and still caps
them by ``max_num_seqs x max_model_len``.
"""

from __future__ import annotations

import logging

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

logger = logging.getLogger("vllm.omni_patches.batch_defaults")
NAME = "_patch_cpu_small_machine_batch_defaults"


def _make(original):
    func = original.__func__  # a classmethod

    def get_batch_defaults(cls, world_size: int):
        tokens_by_ctx, seqs_by_ctx = func(cls, world_size)
        from vllm.platforms import current_platform

        from omni_platform import envs
        from omni_platform.layout import small_machine_batch_defaults
        from omni_platform.platform import OmniPlatform, _allowed_physical_cores

        if not isinstance(current_platform, OmniPlatform):
            return tokens_by_ctx, seqs_by_ctx
        small = small_machine_batch_defaults(_allowed_physical_cores(), envs.OMNI_FEW_CPUS)
        if small is None:
            return tokens_by_ctx, seqs_by_ctx
        tokens, seqs = small
        logger.info(
            "omni-patches: default max_num_batched_tokens=%d max_num_seqs=%d (small machine, <= "
            "OMNI_FEW_CPUS=%d cores); applied only where the engine arguments leave them unset",
            tokens * world_size, seqs, envs.OMNI_FEW_CPUS,
        )
        return ({ctx: tokens * world_size for ctx in tokens_by_ctx},
                {ctx: seqs for ctx in seqs_by_ctx})

    setattr(get_batch_defaults, MARKER, NAME)
    get_batch_defaults.__wrapped_original__ = func
    return [classmethod(get_batch_defaults)]


PATCH = Patch(
    name=NAME,
    targets={"vllm.engine.arg_utils:EngineArgs.get_batch_defaults":
             "42e5cccba312dac9932d488719f5e64fac159ca2b6e2a3b982e1d62c3aa9ca66"},
    make=_make,
    disable_env="OMNI_PATCH_BATCH_DEFAULTS_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/engine/arg_utils.py:EngineArgs.get_batch_defaults`',
    bug=("not a bug: `vllm.LLM` reaches no published hook with its arguments, so omni's small-machine "
         'defaults (`max_num_batched_tokens` 512, `max_num_seqs` 8; values the user leaves unset only)'
         ' need a patch; `vllm serve` gets them through `pre_register_and_update` without it'),
    switch_doc='`OMNI_PATCH_BATCH_DEFAULTS_OFF=1`',
    bug_test=('`tests/test_patches_off.py::test_batch_defaults_off_gives_vllm_llm_the_large_cpu_defaults`'
              " (not a bug: vLLM's CPU defaults for `vllm.LLM`; skipped on machines with more than "
              '`OMNI_FEW_CPUS` physical cores, where omni sets no step budget)'),
    fix_test=('the same test; in an engine '
              '`tests/test_real_engine.py::test_small_machine_step_budget_default_and_user_override`'),
)
