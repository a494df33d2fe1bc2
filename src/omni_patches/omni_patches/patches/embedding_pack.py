"""``_patch_cpu_embedding_gemm_copy``: no GEMM copy of an input embedding until it computes logits.

Upstream behaviour (vLLM 0.28.0, ``vllm/model_executor/layers/vocab_parallel_embedding.py``
``UnquantizedEmbeddingMethod.process_weights_after_loading``): on CPU every unquantized
``VocabParallelEmbedding``, the input embedding included, gets ``dispatch_cpu_unquantized_gemm(layer,
remove_weight=False)`` (``vllm/model_executor/layers/utils.py``): a second copy of the whole table,
packed for a GEMM (sgl-kernel's ``convert_weight_packed`` or a oneDNN handle), beside the table the
lookup reads. Only a module that also computes logits ever calls that GEMM (``apply``): an output head,
which is a ``ParallelLMHead`` and packs its own weight, or an input embedding a model reuses as its head
module. For every other model the copy is never read: on Qwen2.5-Coder-1.5B with a bf16 embedding,
151936 x 1536 x 2 bytes = 445 MiB of RssAnon that ``python -m harness ledger`` found in one anonymous
mapping no live tensor accounts for.

The replacement keeps upstream's behaviour for ``ParallelLMHead`` and off the CPU; for an input embedding
it installs a ``cpu_linear`` that builds the packed copy (upstream's own dispatch) at its first call and
then uses it, so a model that does compute logits with its embedding module gets the same GEMM, once.
"""

from __future__ import annotations

import functools

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

NAME = "_patch_cpu_embedding_gemm_copy"


def _make(process_weights_after_loading):
    @functools.wraps(process_weights_after_loading)
    def replacement(self, layer):
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
        from vllm.platforms import current_platform

        if isinstance(layer, ParallelLMHead) or not current_platform.is_cpu():
            return process_weights_after_loading(self, layer)
        method = self

        def pack_on_first_use(x, weight, bias):
            del layer.cpu_linear  # this function; upstream's dispatch sets the real one
            process_weights_after_loading(method, layer)
            return layer.cpu_linear(x, weight, bias)

        layer.cpu_linear = pack_on_first_use
        return None

    setattr(replacement, MARKER, NAME)
    return [replacement]


PATCH = Patch(
    name=NAME,
    targets={
        "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading":
            "a3c94ddd1d6c0297f3fd5f28c30afb706a9c30b5aa2ae20e89616a91c9fadb1a",
    },
    make=_make,
    disable_env="OMNI_PATCH_EMBEDDING_GEMM_COPY_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/model_executor/layers/vocab_parallel_embedding.py:UnquantizedEmbeddingMethod.process_weights_after_loading`',
    bug=('on CPU every unquantized input embedding gets a second copy of its table packed for a GEMM '
         '(`dispatch_cpu_unquantized_gemm`) that only a module computing logits reads: '
         '466,747,392 bytes (151936 by 1536 bf16 values) on '
         "Qwen2.5-Coder-1.5B with a bf16 embedding (the ledger's largest anonymous mapping without a "
         "tensor); the replacement packs an input embedding at its first logits call instead (Gemma's "
         'logits are its embedding), and leaves `ParallelLMHead` as upstream'),
    switch_doc='`OMNI_PATCH_EMBEDDING_GEMM_COPY_OFF=1`',
    bug_test=('`tests/test_patch_embedding_gemm_copy.py::test_without_the_patch_the_input_embedding_holds_a_packed_copy`'
              " (engine, SmolLM2 bf16: malloc in use and RssAnon grow by the table's 56,623,104 bytes)"),
    fix_test=('`tests/test_patch_embedding_gemm_copy.py::test_with_the_patch_the_same_tokens_and_logprobs`,'
              ' '
              '`tests/test_patch_embedding_gemm_copy.py::test_a_model_whose_logits_come_from_its_embedding_module_gets_the_gemm_at_first_use`'
              ' (a tiny Gemma: the same log-probabilities)'),
)
