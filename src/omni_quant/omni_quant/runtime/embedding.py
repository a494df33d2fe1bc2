"""The input embedding of a cpu_int4 checkpoint, held in its stored 4- or 8-bit form (format_version 4).

vLLM 0.28's ``VocabParallelEmbedding`` (``vllm/model_executor/layers/vocab_parallel_embedding.py``) asks
the quantization config for a method (``get_quant_method(layer, prefix)``), calls its
``create_weights`` with the embedding dimension and this worker's padded vocabulary rows, loads the
checkpoint through the layer's own ``weight_loader`` and, at run time, calls ``embedding(layer, ids)``.
:class:`CpuInt4EmbeddingMethod` answers for the input embedding the converter quantized
(``embedding_modules`` in ``quantization_config``). It keeps the table as stored and, per call,
gathers the looked-up rows of the codes and their constants and dequantizes only those rows, as
llama.cpp does with ``token_embd`` (``ggml_get_rows`` on the file's type). No bf16 copy of the
table is ever made.

Schemes (``V`` rows, ``D`` the embedding dimension; the names are the checkpoint's tensors under the
module, e.g. ``model.embed_tokens.qweight``):

- ``groups``: ``qweight`` uint8 ``[V, D/2]`` (nibbles_low_first), ``scales``, ``zeros`` bf16 ``[V, D/g]``;
  ``w = (q - 8) s + z`` (:func:`omni_quant.format.quant_math.dequantize`);
- ``super_blocks``: ``qweight``, ``sub_scales``, ``sub_mins`` uint8 ``[V, D/32]``, ``super_scales``,
  ``super_mins`` float16 ``[V, D/256]``; ``w = d sc_j q - dmin m_j``
  (:func:`omni_quant.format.super_blocks.dequantize`);
- ``int8``: ``qweight8`` int8 ``[V, D]``, ``scales8`` float16 ``[V, D/32]``; ``w = q d`` (llama.cpp's Q8_0,
  :func:`omni_quant.format.quant_math.dequantize_int8_groups`).

Every product in these formulas is exact in float32 (a 4- or 8-bit integer times a constant of at most
17 significant bits), so the one rounding of the sum and the final one to the activation dtype are
the only ones: a looked-up row equals the same row of the whole table dequantized by the same
function, bit for bit, in eager mode and under torch.compile alike (fused multiply-adds change
nothing). The lookup is plain torch ops (``index_select``, shifts, float math), which inductor traces.

Tensor parallelism: vLLM shards the vocabulary rows; every tensor here has the vocabulary on dim 0
(``output_dim = 0``), so the layer's ``weight_loader`` narrows each to this worker's rows and zero-fills
its padding, as it does a bf16 table.
"""

from __future__ import annotations

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.utils import set_weight_attrs

from omni_quant.format import super_blocks
from omni_quant.format.quant_math import INT8_GROUP, dequantize, dequantize_int8_groups

__all__ = ["SCHEMES", "TENSORS", "CpuInt4EmbeddingMethod", "dequantize_rows", "lookup", "unpack_rows"]

SCHEMES = ("groups", "super_blocks", "int8")
TENSORS = {
    "groups": ("qweight", "scales", "zeros"),
    "super_blocks": super_blocks.TENSORS,
    "int8": ("qweight8", "scales8"),
}
"""The checkpoint tensors of each scheme, in the order :func:`dequantize_rows` takes them."""


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[R, D/2]`` nibbles_low_first -> codes uint8 ``[R, D]`` (the same values as
    :func:`omni_quant.format.packing.unpack`, written without in-place stores so that torch.compile traces it)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def dequantize_rows(scheme: str, *tensors: torch.Tensor) -> torch.Tensor:
    """Rows of a stored table (``tensors`` in :data:`TENSORS` order, any number of rows ``R``) -> float32
    ``[R, D]``. The whole table and a gathered subset of its rows go through the same math.

    Raises:
        ValueError: an unknown scheme."""
    if scheme == "groups":
        packed, scales, zeros = tensors
        return dequantize(unpack_rows(packed), scales, zeros, torch.float32)
    if scheme == "super_blocks":
        packed, *rest = tensors
        return super_blocks.dequantize(unpack_rows(packed), *rest)
    if scheme == "int8":
        return dequantize_int8_groups(*tensors)
    raise ValueError(f"cpu_int4: unknown embedding scheme {scheme!r} (one of {SCHEMES})")


def lookup(scheme: str, tensors: tuple[torch.Tensor, ...], ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The embedding rows of token ``ids`` (int64, any shape ``S``) -> ``[*S, D]`` in ``dtype``: each stored
    tensor's rows gathered (``index_select`` on dim 0), then only those rows dequantized."""
    flat = ids.reshape(-1)
    rows = dequantize_rows(scheme, *(t.index_select(0, flat) for t in tensors))
    return rows.to(dtype).reshape(*ids.shape, rows.shape[-1])


def _divisor(scheme: str, group_size: int) -> int:
    return {"groups": group_size, "super_blocks": super_blocks.SUPER_BLOCK, "int8": INT8_GROUP}[scheme]


class CpuInt4EmbeddingMethod(QuantizeMethodBase):
    """vLLM's quantization method for a ``VocabParallelEmbedding`` stored by omni-quant in 4 or 8 bits.

    Args:
        scheme: one of :data:`SCHEMES`.
        group_size: the group of the ``groups`` scheme (128, 64 or 32); ignored by the others.
        prefix: vLLM's name of the layer (for messages).

    Raises:
        ValueError: an unknown scheme.
    """

    def __init__(self, scheme: str, group_size: int = 32, prefix: str = ""):
        if scheme not in SCHEMES:
            raise ValueError(f"cpu_int4: unknown embedding scheme {scheme!r} (one of {SCHEMES}); re-convert the "
                             "checkpoint with this omni-quant")
        self.scheme = scheme
        self.group_size = group_size
        self.prefix = prefix

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        """Create this worker's stored tensors for ``sum(output_partition_sizes)`` vocabulary rows (padded)
        of ``input_size_per_partition`` = D channels (shapes in the module docstring), each loaded through
        ``extra_weight_attrs["weight_loader"]`` (the layer's own: it takes this worker's rows). Records the
        activation dtype ``params_dtype``, which :meth:`embedding` returns.

        Raises:
            ValueError: D is not a multiple of the scheme's group (the checkpoint does not match the model)."""
        d, rows = input_size_per_partition, sum(output_partition_sizes)
        divisor = _divisor(self.scheme, self.group_size)
        if d % divisor or d % 2:
            raise ValueError(f"cpu_int4: the embedding {self.prefix or '(input embedding)'} has D={d}, not a multiple "
                             f"of its {self.scheme} scheme's {divisor}; the checkpoint does not match this model: "
                             "re-convert it")
        shapes = {
            "groups": ((d // 2, torch.uint8), (d // divisor, torch.bfloat16), (d // divisor, torch.bfloat16)),
            "super_blocks": ((d // 2, torch.uint8), (d // super_blocks.SUB_BLOCK, torch.uint8),
                             (d // super_blocks.SUB_BLOCK, torch.uint8), (d // divisor, torch.float16),
                             (d // divisor, torch.float16)),
            "int8": ((d, torch.int8), (d // divisor, torch.float16)),
        }[self.scheme]
        for name, (cols, dtype) in zip(TENSORS[self.scheme], shapes, strict=True):
            param = Parameter(torch.empty(rows, cols, dtype=dtype), requires_grad=False)
            set_weight_attrs(param, {"input_dim": 1, "output_dim": 0})
            set_weight_attrs(param, extra_weight_attrs)
            layer.register_parameter(name, param)
        layer.cpu_int4_embedding_scheme = self.scheme
        layer.cpu_int4_embedding_dtype = params_dtype

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Nothing to repack: the lookup reads the stored form."""

    def stored(self, layer: torch.nn.Module) -> tuple[torch.Tensor, ...]:
        """The layer's stored tensors, in :data:`TENSORS` order."""
        return tuple(getattr(layer, name) for name in TENSORS[self.scheme])

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        """Rows of token ids ``input_`` (int64 ``[T]``, this worker's row indices) -> ``[T, D]`` in the
        activation dtype (:func:`lookup`)."""
        return lookup(self.scheme, self.stored(layer), input_, layer.cpu_int4_embedding_dtype)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Not a head: vLLM models that compute logits with the input embedding (Gemma, Cohere, MPT) keep it
        in bf16 (the converter does not quantize it there).

        Raises:
            ValueError: always, naming the layer."""
        raise ValueError(f"cpu_int4: the quantized input embedding {self.prefix or ''} was asked for logits; this "
                         "model computes its logits with the input embedding, which cpu_int4 keeps in bf16 there. "
                         "Re-convert with this omni-quant, or with --keep-bf16 embed_tokens")
