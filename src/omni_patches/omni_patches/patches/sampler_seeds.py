"""``_patch_cpu_sampler_seeds``: a seeded request samples the same tokens in any batch on CPU.

vLLM 0.28's CPU sampler (``TopKTopPSampler.forward_cpu``,
``vllm/v1/sample/ops/topk_topp_sampler.py``) takes its fast path, one compiled sample from the
global generator, whenever *not every* request of the batch has its own generator:
``if len(generators) != logits.shape[0]``. A request with ``seed`` batched beside one without
is then sampled from the global generator, and its text changes from run to run (C15,
docs/cases.md); alone, or beside other seeded requests, it is reproducible. The replacement
takes the fast path only when *no* request has a generator, and otherwise draws the
exponential noise of every row, then redraws each seeded row from its own generator, as
vLLM's ``random_sample`` and the all-seeded branch do. Unseeded requests keep the global
generator; the processed logits and logprobs are unchanged.
"""

from __future__ import annotations

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_cpu_sampler_seeds"


def _make(original):
    def forward_cpu(self, logits, generators, k, p):
        import torch
        from vllm.v1.sample.ops.topk_topp_sampler import (
            apply_top_k_top_p,
            compiled_random_sample,
            empty_exponential_noise_like,
            sample_with_exponential_noise,
        )

        logits = apply_top_k_top_p(logits, k, p)
        logits_to_return = None
        if self.logprobs_mode == "processed_logits":
            logits_to_return = logits
        elif self.logprobs_mode == "processed_logprobs":
            logits_to_return = logits.log_softmax(dim=-1, dtype=torch.float32)
        if not generators and not self.use_fp64_gumbel:  # vLLM: len(generators) != logits.shape[0]
            return compiled_random_sample(logits), logits_to_return
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        q = empty_exponential_noise_like(probs, self.use_fp64_gumbel)
        q.exponential_()
        for i, generator in generators.items():
            q[i].exponential_(generator=generator)
        return sample_with_exponential_noise(probs, q), logits_to_return

    setattr(forward_cpu, MARKER, NAME)
    forward_cpu.__wrapped_original__ = original
    return [forward_cpu]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.sample.ops.topk_topp_sampler:TopKTopPSampler.forward_cpu":
             "79878f2d85b4353362a11aa838bd440e52f61f80fd07f16a69d8bfc19c7bdb42"},
    make=_make,
    disable_env="OMNI_PATCH_SAMPLER_SEEDS_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/v1/sample/ops/topk_topp_sampler.py:TopKTopPSampler.forward_cpu`',
    bug=('the CPU sampler takes its fast path (the global generator) whenever not every request of the'
         ' batch has a seed: a seeded request beside an unseeded one is not reproducible (C15)'),
    switch_doc='`OMNI_PATCH_SAMPLER_SEEDS_OFF=1`',
    bug_test=('`tests/test_patches_off.py::test_c15_sampler_seeds_off_a_seeded_row_follows_the_global_generator`;'
              ' '
              '`tests/test_sampler_seeds.py::test_without_the_patch_vllm_ignores_the_seed_in_a_mixed_batch`'
              ' (patches not applied at all)'),
    fix_test=('the first test; '
              '`test_sampler_seeds.py::test_seeded_row_is_reproducible_beside_an_unseeded_one`, in an '
              'engine `::test_c15_seeded_request_beside_an_unseeded_one_gives_the_same_text`'),
)
