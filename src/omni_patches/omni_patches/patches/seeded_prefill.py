"""``_patch_cpu_seeded_chunked_prefill``: a seeded request whose prompt takes several steps no longer kills the engine.

vLLM 0.28 samples a token for every scheduled request, also for one whose prompt is only partly prefilled
(chunked prefill: the prompt is longer than the step's token budget, ``max_num_batched_tokens``, or shares
the step), and discards that token. For a request with its own generator (``seed``) it then rewinds the
generator "as if the token was not sampled": ``gen.set_offset(gen.get_offset() - 4)`` in
``GPUModelRunner._bookkeeping_sync`` (``vllm/v1/worker/gpu_model_runner.py``), which the CPU model runner
inherits. That is the CUDA (Philox) generator's API; torch's CPU generator raises ``RuntimeError: CPU Generator
does not use offset``, the engine core dies, and every request of every client fails with
``EngineDeadError``. One request with ``seed`` and a prompt longer than the step budget (512 tokens on
omni's small machines) was enough (found by the soak, ``harness/load/soak.py``; docs/cases.md).

The replacement, on ``CPUModelRunner`` only: ``_sample`` saves the state (``Generator.get_state``) of each CPU
generator of a request whose token will be discarded and restores it after sampling (the exact rewind: the
next draw is the one an unchunked prefill would have made); ``_bookkeeping_sync`` then runs with those
generators out of its view, so vLLM's offset rewind is skipped for them and runs unchanged for any other.
"""

from __future__ import annotations

import functools

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_cpu_seeded_chunked_prefill"


def _discarded_cpu_generators(runner) -> dict[int, object]:
    """``{batch row: torch.Generator}`` of the rows whose sampled token this step discards, CPU generators only."""
    import numpy as np

    num_reqs = runner.input_batch.num_reqs
    gens = runner.input_batch.generators
    out = {}
    for i in np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]:
        gen = gens.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            out[int(i)] = gen
    return out


def _make(sample, bookkeeping):
    @functools.wraps(sample)
    def _sample(self, logits, spec_decode_metadata):
        saved = {i: (g, g.get_state()) for i, g in _discarded_cpu_generators(self).items()}
        out = sample(self, logits, spec_decode_metadata)
        for gen, state in saved.values():
            gen.set_state(state)
        return out

    @functools.wraps(bookkeeping)
    def _bookkeeping_sync(self, *args, **kwargs):
        gens = self.input_batch.generators
        held = {i: gens.pop(i) for i in _discarded_cpu_generators(self)}
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            gens.update(held)

    for fn in (_sample, _bookkeeping_sync):
        setattr(fn, MARKER, NAME)
    return [_sample, _bookkeeping_sync]


PATCH = Patch(
    name=NAME,
    targets={
        # both inherited from GPUModelRunner (vllm/v1/worker/gpu_model_runner.py); set on the CPU runner only
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner._sample":
            "e8615af5c218993395c9ae6573c2f16aa22aa16b9d22681dbb4e3451040b4ff0",
        "vllm.v1.worker.cpu_model_runner:CPUModelRunner._bookkeeping_sync":
            "b875d1040a55176c5687c91c262df8e1c9dc83a5a25d1f769a4de63ede68f638",
    },
    make=_make,
    disable_env="OMNI_PATCH_SEEDED_PREFILL_OFF",
    doc=__doc__.split("\n")[0],
    where=('`vllm/v1/worker/cpu_model_runner.py:CPUModelRunner._sample`, '
           '`CPUModelRunner._bookkeeping_sync` (both inherited from `GPUModelRunner`, '
           '`gpu_model_runner.py`)'),
    bug=('a request with `seed` whose prompt takes more than one step (chunked prefill) kills the '
         "engine core: vLLM rewinds its generator with `set_offset(get_offset() - 4)`, which torch's "
         'CPU generator refuses ("CPU Generator does not use offset"), and every client\'s request then'
         " fails (C32). The replacement saves and restores the generator's state around the discarded "
         "sample (the exact rewind) and hides those generators from vLLM's offset rewind"),
    switch_doc='`OMNI_PATCH_SEEDED_PREFILL_OFF=1`',
    bug_test=('`tests/test_seeded_prefill.py::test_c32_without_the_patch_the_seeded_chunked_prompt_kills_vllms_engine`'
              " (engine: the probe dies with vLLM's RuntimeError)"),
    fix_test=('`tests/test_seeded_prefill.py::test_c32_a_seeded_request_with_a_chunked_prompt_keeps_the_engine_and_its_tokens`'
              " (engine: repeats its tokens, equal to an unchunked prefill's)"),
)
