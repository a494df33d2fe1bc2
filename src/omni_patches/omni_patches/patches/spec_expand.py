"""``_patch_cpu_spec_expand_kernel``: speculative decoding reads each request's own temperature, top-k and top-p.

The rejection sampler expands per-request sampling parameters to one value per draft position
(``expand_batch_to_tokens``, ``vllm/v1/sample/rejection_sampler.py``, vLLM 0.28) through ``expand_kernel``,
which the CPU model runner replaces with ``vllm/utils/cpu_triton_utils.py:_expand_kernel_impl``. That function
hands the C++ kernel (int64 only) ``output.to(torch.int64)``: for the float32 ``temperature`` and ``top_p``
and the int32 ``top_k`` this is a new tensor, so the kernel writes into a copy and the caller's tensor stays
as ``new_empty`` left it (uninitialised memory); the values read were truncated to integers too. Whenever a
step verifies drafts for a batch that is not all greedy, the target logits were divided by garbage and cut
by a garbage top-k/top-p:

- a greedy request with structured output beside a sampled one drew token 0 (the logits became NaN): the
  grammar rejected it and vLLM ended the request with ``finish_reason`` "error" (C25);
- a seeded sampled request did not repeat its tokens (the garbage differs between runs; docs/speculation.md).

The replacement computes the same expansion with torch (``repeat_interleave`` of each request's value, the
value ``replace_from`` replaced by ``replace_to``, as the Triton kernel does) and writes it into ``output``
itself, for every dtype.
"""

from __future__ import annotations

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH", "expand_into"]

NAME = "_patch_cpu_spec_expand_kernel"


def expand_into(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:  # noqa: N803
    """Write ``input_val[i]`` (``replace_from`` read as ``replace_to``) into ``output`` once per token of request i.

    Args:
        output: ``[num_tokens]``, any dtype; rows past ``cu_num_tokens[-1]`` are left as they are.
        input_val: ``[batch_size]``, one value per request.
        cu_num_tokens: ``[batch_size]`` cumulative token counts (int32 or int64).
        replace_from, replace_to: numbers; ``MAX_NUM_TOKENS``: the Triton kernel's block size, unused.
    """
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded)


def _make(original):
    def replacement(*args, **kwargs):
        return expand_into(*args, **kwargs)

    replacement.__wrapped_original__ = original
    setattr(replacement, MARKER, NAME)
    return [replacement]


PATCH = Patch(
    name=NAME,
    # the function inside the _FuncWrapper the CPU model runner installs as the rejection sampler's expand_kernel
    targets={"vllm.utils.cpu_triton_utils:expand_kernel.func":
             "b0d7df291932f1c3d0818bcba211d3c9b2a701de070dc888ff659948763e9559"},
    make=_make,
    disable_env="OMNI_PATCH_SPEC_EXPAND_OFF",
    doc=__doc__.split("\n")[0],
    where=('`vllm/utils/cpu_triton_utils.py:expand_kernel.func` (`_expand_kernel_impl`, which the CPU '
           "model runner installs as the rejection sampler's `expand_kernel`)"),
    bug=("it passes its int64-only C++ kernel an int64 copy of the output, so the rejection sampler's "
         'per-token temperature, top-k and top-p stay uninitialised whenever drafts are verified in a '
         'batch that is not all greedy: seeded sampling under speculation did not repeat, and a greedy'
         ' request with structured output beside a sampled one drew token 0 and ended with "error" '
         "(C25). The replacement writes the expansion into the caller's tensor with torch"),
    switch_doc='`OMNI_PATCH_SPEC_EXPAND_OFF=1`',
    bug_test=('`tests/test_patch_switches.py::test_c25_spec_expand_off_leaves_the_float_temperatures_unwritten`'
              " (vLLM's expansion into a float32 tensor leaves it as it was)"),
    fix_test=("the same test (each request's value, once per token); "
              '`tests/test_spec_structured.py::test_c25_structured_output_under_speculation_keeps_every_grammar`'
              ' (engine)'),
)
