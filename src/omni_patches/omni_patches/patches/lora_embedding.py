"""``_patch_lora_on_quantized_embeddings``: LoRA starts on a model whose embedding and output head are quantized.

With ``enable_lora`` vLLM 0.28 wraps every supported module, whatever the adapter targets
(``LoRAModelManager._create_lora_modules``, ``vllm/lora/model_manager.py``), and two of its wrappers read the
base layer's ``weight``, which a cpu_int4 checkpoint does not have (``omni_quant.runtime.embedding`` stores the input
embedding 8- or 4-bit, the output head is a 4- or 8-bit linear). Start-up died with ``AttributeError:
'VocabParallelEmbedding' object has no attribute 'weight'`` and then the same for ``ParallelLMHead`` (C19):

- ``VocabParallelEmbeddingWithLoRA.create_lora_weights`` (``vllm/lora/layers/vocal_parallel_embedding.py``)
  slices and zeroes ``weight`` rows. The replacement of its ``can_replace_layer`` answers "cannot replace"
  for an embedding without ``weight``: vLLM leaves it unwrapped (``vllm/lora/utils.py:from_layer``), so
  adapters apply to every other layer. An adapter that carries embedding weights is not refused: vLLM
  accepts the module name (``embed_tokens`` is among the model's embedding modules) and, with no wrapper
  there, those weights are not applied (a gap left open: such adapters, for added tokens, are rare).
- ``from_layer_logits_processor`` (``vllm/lora/utils.py``, called from ``model_manager``) reads
  ``lm_head.weight.dtype`` and ``.device`` only to build ``LogitsProcessorWithLoRA``, which computes the base
  logits through the head's own quant method (``LogitsProcessor._apply_head``) and adds the LoRA delta. The
  replacement builds it with the device of the head's first parameter and LoRA's dtype when the head has no
  ``weight``; a head with ``weight`` gets vLLM's function unchanged.
"""

from __future__ import annotations

import logging

from omni_patches.patches import MARKER, Patch

__all__ = ["PATCH"]

logger = logging.getLogger("vllm.omni_patches.lora_embedding")
NAME = "_patch_lora_on_quantized_embeddings"


def _make(can_replace, from_logits_processor):
    func = can_replace.__func__  # a classmethod

    def can_replace_layer(cls, source_layer, lora_config, packed_modules_list, model_config=None) -> bool:
        if not func(cls, source_layer, lora_config, packed_modules_list, model_config):
            return False
        if hasattr(source_layer, "weight"):
            return True
        logger.info("omni-patches: LoRA leaves the quantized input embedding (%s) as it is: adapters apply to "
                    "the other layers", type(getattr(source_layer, "quant_method", None)).__name__)
        return False

    def from_layer_logits_processor(layer, lm_head, max_loras, lora_config, model_config=None):
        if hasattr(lm_head, "weight"):
            return from_logits_processor(layer, lm_head, max_loras, lora_config, model_config)
        import torch
        from vllm.lora.layers.logits_processor import LogitsProcessorWithLoRA

        device = next(lm_head.parameters()).device
        dtype = lora_config.lora_dtype if isinstance(lora_config.lora_dtype, torch.dtype) else torch.bfloat16
        ret = LogitsProcessorWithLoRA(layer, lm_head.embedding_dim, dtype, device,
                                      lm_head.get_sharded_to_full_mapping())
        ret.create_lora_weights(max_loras, lora_config, model_config)
        return ret

    setattr(can_replace_layer, MARKER, NAME)
    can_replace_layer.__wrapped_original__ = func
    setattr(from_layer_logits_processor, MARKER, NAME)
    from_layer_logits_processor.__wrapped_original__ = from_logits_processor
    return [classmethod(can_replace_layer), from_layer_logits_processor]


PATCH = Patch(
    name=NAME,
    targets={
        "vllm.lora.layers.vocal_parallel_embedding:VocabParallelEmbeddingWithLoRA.can_replace_layer":
            "21e9d27263f1056b0d9c95a7b286bb38603884cea1fb4ab61f452b4d127b3a7f",
        # vllm/lora/utils.py's function, as model_manager imported it (the name the manager calls)
        "vllm.lora.model_manager:from_layer_logits_processor":
            "f4c7423363017ebfec0d7cc58825357f48e7634f956e211b0260843a7c832fd3",
    },
    make=_make,
    disable_env="OMNI_PATCH_LORA_EMBEDDING_OFF",
    doc=__doc__.split("\n")[0],
    where=('`vllm/lora/layers/vocal_parallel_embedding.py:VocabParallelEmbeddingWithLoRA.can_replace_layer`,'
           " `vllm/lora/model_manager.py:from_layer_logits_processor` (`vllm/lora/utils.py`'s "
           'function, as the manager imported it)'),
    bug=('with `enable_lora` vLLM wraps every supported module and its embedding and logits wrappers '
         "read the base layer's `weight`, which a cpu_int4 embedding and output head do not have: "
         'start-up died with `AttributeError` (C19). The replacement leaves a quantized input '
         'embedding unwrapped (adapters apply to every other layer; an adapter with embedding weights '
         "is refused by vLLM at load) and builds the LoRA logits processor from the head's parameter "
         "device and LoRA's dtype. The linear layers need no patch: omni exposes their repacked weight"
         " as `qweight`, the name vLLM's `_get_lora_device` looks for"),
    switch_doc='`OMNI_PATCH_LORA_EMBEDDING_OFF=1`',
    bug_test=('`tests/test_patch_switches.py::test_c19_lora_embedding_off_a_lora_engine_on_cpu_int4_does_not_start`'
              " (engine: an `enable_lora` engine on SmolLM2 cpu_int4 dies with vLLM's `AttributeError`"
              ' on `weight`)'),
    fix_test=('`tests/test_lora.py::test_c19_lora_adapters_on_a_cpu_int4_base` (engine: a zero adapter'
              " gives the base's tokens, a random one changes them, the same each time)"),
)
