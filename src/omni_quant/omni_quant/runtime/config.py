"""The ``cpu_int4`` quantization method for vLLM: config and linear method.

Registered with vLLM's ``register_quantization_config`` (vLLM 0.28) in every process by
omni's general plugin. A checkpoint whose ``config.json`` carries
``quantization_config.quant_method == "cpu_int4"`` selects it with no flag.

Every ``LinearBase`` subclass (QKV, merged column, column, row, replicated) and the
``ParallelLMHead`` get :class:`CpuInt4LinearMethod`; the input embedding named in
``embedding_modules`` (format_version 4) gets :class:`omni_quant.runtime.embedding.CpuInt4EmbeddingMethod`
(a lookup of its stored 4- or 8-bit rows), any other stays bf16. Checkpoint tensors per module (see docs/cpu_int4.md):
``qweight`` uint8 ``[N, K/2]``, ``scales`` and ``zeros`` ``[N, K/group_size]``.
At load they are repacked once into the layout of the kernel chosen for the layer on this
CPU (:mod:`omni_quant.runtime.kernel_choice`): omni's W4A8 kernel where it was built and fits, else
torch's CPU int4 layout; the on-disk tensors are then dropped, so one layout stays resident.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.parameter import GroupQuantScaleParameter, ModelWeightParameter

from omni_quant.format import super_blocks
from omni_quant.format.packing import FORMAT_VERSION, READABLE_FORMAT_VERSIONS, PackFormat, unpack
from omni_quant.format.quant_math import GROUP_SIZES, choose_group_size
from omni_quant.kernels import w4a8 as native
from omni_quant.runtime import huge_pages, layout_cache
from omni_quant.runtime.embedding import CpuInt4EmbeddingMethod
from omni_quant.runtime.kernel_choice import Choice, choose, measure_dequant_min_rows
from omni_quant.runtime.linear_int8 import CpuInt8LinearMethod
from omni_quant.runtime.torch_int4 import cpu_int4_linear

__all__ = ["QUANT_METHOD", "CpuInt4Config", "CpuInt4LinearMethod"]

QUANT_METHOD = "cpu_int4"
PER_GROUP_ISAS = ("avx2vnni",)
"""CPUs on which a super-block layer is rewritten per group of 32 at load (exact in float32, scales and
zeros then rounded to bf16: 5.0 bits a weight resident instead of 4.625) for the per-group kernel:
AVX-VNNI (256-bit) CPUs, whose ``vpdpbusd`` per-group path was measured and for which no super-block
kernel is written. AVX2 CPUs without VNNI and AVX-512 VNNI CPUs run a super-block kernel of their own
(docs/cpu_int4.md)."""
logger = logging.getLogger("vllm.omni_quant")
_logged: set[tuple] = set()


def _log_choice(n: int, k: int, group_size: int, choice: Choice, layout: str = "groups") -> None:
    """One ``omni-quant:`` line per distinct layer shape, layout and choice in a process."""
    key = (n, k, group_size, choice.kernel, choice.dequant_min_rows, layout)
    if key in _logged:
        return
    _logged.add(key)
    scheme = "super-blocks of 256" if layout == "super_blocks" else f"group {group_size}"
    if choice.kernel == "native":
        prefill = (f"prefill: dequantize + bf16 GEMM from {choice.dequant_min_rows} rows"
                   if choice.dequant_min_rows else "prefill: the same kernel")
        isa = native.super_block_isa() if layout == "super_blocks" else native.best_isa()
        logger.info("omni-quant: cpu_int4 [%d x %d] %s: omni W4A8 kernel (%s); %s (%s); "
                    "override with OMNI_INT4_KERNEL / OMNI_INT4_DEQUANT_MIN_ROWS",
                    n, k, scheme, isa, prefill, choice.reason)
    else:
        logger.info("omni-quant: cpu_int4 [%d x %d] %s: torch _weight_int4pack_mm_for_cpu (%s)",
                    n, k, scheme, choice.reason)


class CpuInt4Config(QuantizationConfig):
    """``quantization_config`` of a cpu_int4 checkpoint.

    Args:
        group_size: preferred group size (128, 64 or 32); each module uses the largest
            supported size <= it that divides its K (recorded per module by the converter).
        modules_to_not_convert: module names kept in bf16 (e.g. ``lm_head``).
        format_version: the packing format version (``omni_quant.format.packing.READABLE_FORMAT_VERSIONS``).
        group_size_per_module: the group size the converter used for each 4-bit module.
        bits: the width of a module not named in ``bits_per_module``, 4 or 8 (8-bit weight-only:
            :mod:`omni_quant.runtime.linear_int8`).
        bits_per_module: module name -> 4 or 8, as the converter's recipe chose.
        super_block_modules: the 4-bit modules stored in super-blocks (format_version 3,
            :mod:`omni_quant.format.super_blocks`); the others are per group.
        embedding_modules: the quantized input embedding(s) (format_version 4, :mod:`omni_quant.runtime.embedding`),
            by checkpoint name (``model.embed_tokens``); each one's scheme is read from the same maps as a
            linear layer's: 8-bit per group of 32 when ``bits_per_module`` says 8, super-blocks when in
            ``super_block_modules``, else per group of ``group_size_per_module``. Absent (older checkpoints):
            the embedding is bf16.

    Raises:
        ValueError: an unsupported group size, width or format version (the message says what to do).
    """

    def __init__(self, group_size: int = 128, modules_to_not_convert: list[str] | None = None,
                 format_version: int = FORMAT_VERSION, group_size_per_module: dict[str, int] | None = None,
                 bits: int = 4, bits_per_module: dict[str, int] | None = None,
                 super_block_modules: list[str] | None = None, embedding_modules: list[str] | None = None):
        super().__init__()
        if group_size not in GROUP_SIZES:
            raise ValueError(f"cpu_int4: group_size {group_size} is not one of {GROUP_SIZES}")
        if format_version not in READABLE_FORMAT_VERSIONS:
            raise ValueError(
                f"cpu_int4: checkpoint format_version {format_version}, this omni-quant reads "
                f"{READABLE_FORMAT_VERSIONS}; re-convert with `omni-quant convert` or upgrade omni-quant"
            )
        widths = {bits, *(bits_per_module or {}).values()}
        if not widths <= {4, 8}:
            raise ValueError(f"cpu_int4 supports 4- and 8-bit modules, the checkpoint says {sorted(widths)}")
        if widths != {4} and format_version < 2:
            raise ValueError("cpu_int4: 8-bit modules need format_version 2; the checkpoint's config is inconsistent")
        if super_block_modules and format_version < 3:
            raise ValueError("cpu_int4: super-block modules need format_version 3; "
                             "the checkpoint's config is inconsistent")
        sbm = super_block_modules or []
        if isinstance(sbm, str) or not all(isinstance(m, str) for m in sbm):
            raise ValueError(f"cpu_int4: super_block_modules must be a list of module names, got {sbm!r}")
        both = set(sbm) & {m for m, b in (bits_per_module or {}).items() if int(b) == 8}
        if both:
            raise ValueError(f"cpu_int4: {sorted(both)} are both 8-bit (bits_per_module) and in super-blocks; "
                             "the checkpoint's config is inconsistent: re-convert it")
        self.super_block_modules = set(sbm)
        emb = embedding_modules or []
        if isinstance(emb, str) or not all(isinstance(m, str) for m in emb):
            raise ValueError(f"cpu_int4: embedding_modules must be a list of module names, got {emb!r}")
        if emb and format_version < 4:
            raise ValueError("cpu_int4: a quantized input embedding needs format_version 4; the checkpoint's config "
                             "is inconsistent: re-convert it")
        self.embedding_modules = list(emb)
        self.group_size = group_size
        self.modules_to_not_convert = list(modules_to_not_convert or [])
        self.group_size_per_module = dict(group_size_per_module or {})
        self.bits = bits
        self.bits_per_module = dict(bits_per_module or {})

    def __repr__(self) -> str:
        return f"CpuInt4Config(group_size={self.group_size}, modules_to_not_convert={self.modules_to_not_convert})"

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return -1  # CPU: no GPU compute capability applies

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CpuInt4Config:
        fmt = config.get("pack_format", PackFormat.NIBBLES_LOW_FIRST.value)
        if fmt != PackFormat.NIBBLES_LOW_FIRST.value:
            raise ValueError(f"cpu_int4: unknown pack_format {fmt!r}")
        return cls(
            group_size=config.get("group_size", 128),
            modules_to_not_convert=config.get("modules_to_not_convert"),
            format_version=config.get("format_version", FORMAT_VERSION),
            group_size_per_module=config.get("group_size_per_module"),
            bits=config.get("bits", 4),
            bits_per_module=config.get("bits_per_module"),
            super_block_modules=config.get("super_block_modules"),
            embedding_modules=config.get("embedding_modules"),
        )

    def _skipped(self, prefix: str) -> bool:
        """Whether vLLM's layer ``prefix`` is kept unquantized: named in ``modules_to_not_convert``
        (a suffix at a name boundary, or a parent module), a fused layer through its members
        (vLLM's ``is_layer_skipped`` with the model's ``packed_modules_mapping``; raises
        ``ValueError`` when only some members are kept)."""
        from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

        if any(prefix.startswith(m + ".") for m in self.modules_to_not_convert):
            return True
        return is_layer_skipped(prefix, list(self.modules_to_not_convert), self.packed_modules_mapping,
                                match_mode="suffix")

    def group_size_for(self, prefix: str, input_size: int) -> int:
        """The group size the converter recorded for vLLM's layer ``prefix`` (a fused layer: its
        members', which must agree), else the largest supported size dividing ``input_size``.

        Raises:
            ValueError: the members of a fused layer were converted with different group sizes.
        """
        recorded = self.group_size_per_module or {}
        if prefix in recorded:
            return int(recorded[prefix])
        proj = prefix.rsplit(".", 1)[-1]
        members = self.packed_modules_mapping.get(proj, ())
        sizes = {int(recorded[p]) for p in (prefix[: len(prefix) - len(proj)] + m for m in members) if p in recorded}
        if len(sizes) > 1:
            raise ValueError(f"cpu_int4: the members {list(members)} of {prefix} were converted with different "
                             f"group sizes {sorted(sizes)}; re-convert with one --group-size")
        if sizes:
            return sizes.pop()
        return choose_group_size(input_size, self.group_size, prefix or "linear")

    def bits_for(self, prefix: str) -> int:
        """The width (4 or 8) the converter recorded for vLLM's layer ``prefix`` (a fused layer: its
        members', which must agree), else the checkpoint's ``bits``.

        Raises:
            ValueError: the members of a fused layer were converted at different widths.
        """
        recorded = self.bits_per_module
        if prefix in recorded:
            return int(recorded[prefix])
        proj = prefix.rsplit(".", 1)[-1]
        members = self.packed_modules_mapping.get(proj, ())
        widths = {int(recorded.get(prefix[: len(prefix) - len(proj)] + m, self.bits)) for m in members}
        if len(widths) > 1:
            raise ValueError(f"cpu_int4: the members {list(members)} of {prefix} were converted at different "
                             f"widths {sorted(widths)}; re-convert with one recipe for them")
        return widths.pop() if widths else self.bits

    def super_blocks_for(self, prefix: str) -> bool:
        """Whether vLLM's layer ``prefix`` is stored in super-blocks (a fused layer: its members,
        which must agree).

        Raises:
            ValueError: some members of a fused layer are in super-blocks and some are not.
        """
        if prefix in self.super_block_modules:
            return True
        proj = prefix.rsplit(".", 1)[-1]
        members = self.packed_modules_mapping.get(proj, ())
        found = {prefix[: len(prefix) - len(proj)] + m in self.super_block_modules for m in members}
        if len(found) > 1:
            raise ValueError(f"cpu_int4: some members of {prefix} ({list(members)}) are stored in super-blocks and "
                             "some per group; vLLM fuses them into one layer: re-convert with one scheme for them")
        return found.pop() if found else False

    def _method(self, prefix: str):
        return CpuInt8LinearMethod(prefix) if self.bits_for(prefix) == 8 else CpuInt4LinearMethod(self, prefix)

    def embedding_for(self, prefix: str) -> str | None:
        """The checkpoint name of the quantized input embedding vLLM builds as ``prefix``, or None (bf16).

        ``prefix`` matches a name of ``embedding_modules`` exactly or at a name boundary (either way round:
        vLLM may prefix or shorten names); an empty prefix (vLLM 0.28's Llama builds its embedding without
        one) is the checkpoint's single quantized embedding."""
        for m in self.embedding_modules:
            if prefix == m or prefix.endswith("." + m) or m.endswith("." + prefix):
                return m
        if not prefix and len(self.embedding_modules) == 1:
            return self.embedding_modules[0]
        return None

    def embedding_method(self, module: str) -> CpuInt4EmbeddingMethod:
        """The lookup method of the quantized input embedding ``module`` (a name of ``embedding_modules``)."""
        if int(self.bits_per_module.get(module, self.bits)) == 8:
            return CpuInt4EmbeddingMethod("int8", prefix=module)
        if module in self.super_block_modules:
            return CpuInt4EmbeddingMethod("super_blocks", prefix=module)
        return CpuInt4EmbeddingMethod("groups", int(self.group_size_per_module.get(module, self.group_size)), module)

    def checkpoint_prefix(self, prefix: str) -> str:
        """vLLM's layer ``prefix`` as the checkpoint names it: the longest tail of its dotted name that
        the converter recorded (directly or, for a fused layer, through its members), else ``prefix``.

        A draft model for speculative decoding is built under an extra leading name (vLLM 0.28,
        ``vllm/v1/spec_decode/draft_model.py``: ``get_model(..., prefix="draft_model")``), so its layers
        arrive as ``draft_model.model.layers.0.mlp.down_proj`` while its own checkpoint records
        ``model.layers.0.mlp.down_proj``: without this, its super-block layers got per-group tensors."""
        known = set(self.group_size_per_module) | set(self.bits_per_module) | self.super_block_modules
        if not known or prefix in known:
            return prefix
        parts = prefix.split(".")
        members = self.packed_modules_mapping.get(parts[-1], ())
        for i in range(1, len(parts)):
            tail = ".".join(parts[i:])
            head = tail[: len(tail) - len(parts[-1])]
            if tail in known or any(head + m in known for m in members):
                return tail
        return prefix

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        prefix = self.checkpoint_prefix(prefix)
        # ParallelLMHead first: it is a VocabParallelEmbedding too
        if isinstance(layer, ParallelLMHead):
            return None if self._skipped(prefix) else self._method(prefix)
        if isinstance(layer, VocabParallelEmbedding):
            module = self.embedding_for(prefix)
            return None if module is None else self.embedding_method(module)
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod() if self._skipped(prefix) else self._method(prefix)
        return None


@register_weight_loader_v2_supported_method
class CpuInt4LinearMethod(LinearMethodBase):
    """4-bit linear for CPU: omni's W4A8 kernel (:mod:`omni_quant.kernels.w4a8`) or, where it cannot run,
    ``aten._weight_int4pack_mm_for_cpu`` called directly (:mod:`omni_quant.runtime.torch_int4`); which one, and
    from how many rows prefill dequantizes to bf16, is decided per layer at load
    (:mod:`omni_quant.runtime.kernel_choice`)."""

    def __init__(self, config: CpuInt4Config, prefix: str = ""):
        self.config = config
        self.prefix = prefix

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        """Create this shard's checkpoint tensors: ``qweight`` uint8 ``[N, K/2]`` and, per group,
        ``scales`` and ``zeros`` ``[N, K/g]``, or, in super-blocks, ``sub_scales`` and ``sub_mins`` uint8
        ``[N, K/32]`` and ``super_scales`` and ``super_mins`` float16 ``[N, K/256]``.

        Raises:
            ValueError: the group size (or the super-block of 256) does not divide this shard's K
                (tensor parallelism split K into pieces the groups do not fit).
        """
        sb = self.config.super_blocks_for(self.prefix)
        group_size = super_blocks.SUPER_BLOCK if sb else self.config.group_size_for(self.prefix, input_size)
        if input_size_per_partition % group_size or input_size_per_partition % 2:
            raise ValueError(
                f"cpu_int4: {self.prefix}: this worker's shard has K={input_size_per_partition} "
                f"(of {input_size}), not a multiple of {'the super-block of' if sb else 'group_size='}{group_size}; "
                "use a smaller tensor_parallel_size or convert with a smaller --group-size"
            )
        weight_loader = extra_weight_attrs["weight_loader"]
        n, k = sum(output_partition_sizes), input_size_per_partition

        def add(name: str, cols: int, dtype: torch.dtype, cls=GroupQuantScaleParameter) -> None:
            layer.register_parameter(name, cls(data=torch.empty(n, cols, dtype=dtype), input_dim=1, output_dim=0,
                                               weight_loader=weight_loader))

        add("qweight", k // 2, torch.uint8, ModelWeightParameter)
        if sb:
            add("sub_scales", k // super_blocks.SUB_BLOCK, torch.uint8)
            add("sub_mins", k // super_blocks.SUB_BLOCK, torch.uint8)
            add("super_scales", k // super_blocks.SUPER_BLOCK, torch.float16)
            add("super_mins", k // super_blocks.SUPER_BLOCK, torch.float16)
        else:
            add("scales", k // group_size, params_dtype)
            add("zeros", k // group_size, params_dtype)
        layer.cpu_int4_group_size = super_blocks.SUB_BLOCK if sb else group_size
        layer.cpu_int4_super_blocks = sb
        layout_cache.adopt(self.config, layer, self.prefix, n, k, _log_choice)  # mapped from a layout file?

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack once into the layout of the kernel chosen for this layer; drop the on-disk tensors.

        Super-block layers run omni's super-block kernel where it is built and fits (N a multiple of
        16) and the CPU is not in :data:`PER_GROUP_ISAS`; elsewhere they are rewritten per group of 32
        (:func:`omni_quant.format.super_blocks.to_groups`) for the per-group kernel or torch's int4 kernel.

        A layer adopted from a layout file (:mod:`omni_quant.runtime.layout_cache`) has its tensors already; after
        the model's last layer the layout file is written when some layer was repacked.

        Raises:
            ValueError: from :func:`omni_quant.runtime.kernel_choice.choose` (an impossible override).
        """
        if not layer.cpu_int4_mapped:
            self._repack(layer)
        layout_cache.finish(self.config, layer, self.prefix)
        _expose_for_lora(layer)

    def _repack(self, layer: torch.nn.Module) -> None:
        if layer.cpu_int4_super_blocks:
            self._process_super_blocks(layer)
            return
        codes = unpack(layer.qweight.data)
        scales, zeros = layer.scales.data, layer.zeros.data
        del layer.qweight, layer.scales, layer.zeros
        self._process_groups(layer, codes, scales, zeros)

    def _process_groups(self, layer: torch.nn.Module, codes: torch.Tensor, scales: torch.Tensor,
                        zeros: torch.Tensor) -> None:
        n, k = codes.shape
        group_size = layer.cpu_int4_group_size
        repacked: list[tuple[torch.Tensor, torch.Tensor]] = []

        def measure() -> int:
            repacked.append(native.repack(codes, scales, zeros))
            w, sz = repacked[0]
            return measure_dequant_min_rows(lambda x, rows: native.linear(x, w, sz, group_size, dequant_min_rows=rows),
                                            k)

        choice = choose((n, k), group_size, isinstance(layer, ParallelLMHead), measure)
        _log_choice(n, k, group_size, choice)
        layer.cpu_int4_kernel = choice.kernel
        if choice.kernel == "native":
            w, sz = repacked[0] if repacked else native.repack(codes, scales, zeros)
            layer.w4a8_weight = torch.nn.Parameter(huge_pages.place(w), requires_grad=False)
            layer.w4a8_scales_zeros = torch.nn.Parameter(huge_pages.place(sz), requires_grad=False)
            layer.register_buffer(  # a tensor the kernel reads at run time, not a constant of the graph
                "cpu_int4_dequant_rows", torch.tensor(choice.dequant_min_rows, dtype=torch.int64), persistent=False)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
            sz = torch.stack([scales.t(), zeros.t()], dim=-1).contiguous()
            layer.int4_weight = torch.nn.Parameter(huge_pages.place(packed), requires_grad=False)
            layer.int4_scales_zeros = torch.nn.Parameter(huge_pages.place(sz), requires_grad=False)

    def _process_super_blocks(self, layer: torch.nn.Module) -> None:
        parts = (unpack(layer.qweight.data), layer.sub_scales.data, layer.sub_mins.data, layer.super_scales.data,
                 layer.super_mins.data)
        del layer.qweight, layer.sub_scales, layer.sub_mins, layer.super_scales, layer.super_mins
        n, k = parts[0].shape
        if native.best_isa() in PER_GROUP_ISAS:
            # an AVX-VNNI CPU: its per-group kernel, on the same weight rewritten per group of 32
            layer.cpu_int4_super_blocks = False
            codes, scales, zeros = super_blocks.to_groups(*parts)
            self._process_groups(layer, codes, scales.to(torch.bfloat16), zeros.to(torch.bfloat16))
            return
        repacked: list[tuple[torch.Tensor, torch.Tensor]] = []

        def measure() -> int:
            repacked.append(native.repack_super_blocks(*parts))
            w, sb = repacked[0]
            return measure_dequant_min_rows(lambda x, rows: native.linear_super_blocks(x, w, sb, dequant_min_rows=rows),
                                            k)

        choice = choose((n, k), super_blocks.SUPER_BLOCK, isinstance(layer, ParallelLMHead), measure,
                        layout="super_blocks")
        _log_choice(n, k, super_blocks.SUB_BLOCK, choice, "super_blocks")
        if choice.kernel != "native":
            layer.cpu_int4_super_blocks = False
            codes, scales, zeros = super_blocks.to_groups(*parts)
            self._process_groups(layer, codes, scales.to(torch.bfloat16), zeros.to(torch.bfloat16))
            return
        layer.cpu_int4_kernel = "native"
        w, sb = repacked[0] if repacked else native.repack_super_blocks(*parts)
        layer.w4a8_weight = torch.nn.Parameter(huge_pages.place(w), requires_grad=False)
        layer.w4a8_super_blocks = torch.nn.Parameter(huge_pages.place(sb), requires_grad=False)
        layer.register_buffer(
            "cpu_int4_dequant_rows", torch.tensor(choice.dequant_min_rows, dtype=torch.int64), persistent=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.cpu_int4_kernel == "native":
            if layer.cpu_int4_super_blocks:
                return native.linear_super_blocks(x, layer.w4a8_weight, layer.w4a8_super_blocks, bias, "auto",
                                                  layer.cpu_int4_dequant_rows)
            return native.linear(x, layer.w4a8_weight, layer.w4a8_scales_zeros, layer.cpu_int4_group_size, bias,
                                 "auto", layer.cpu_int4_dequant_rows)
        return cpu_int4_linear(x, layer.int4_weight, layer.int4_scales_zeros, layer.cpu_int4_group_size, bias)

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module):
        raise ValueError(
            f"cpu_int4: {self.prefix} is quantized but the config ties it to the input embedding; "
            "cpu_int4 checkpoints store a quantized output head untied (tie_word_embeddings: false). "
            "Re-convert with `omni-quant convert`, or keep the head in bf16 with --keep-bf16 lm_head."
        )


def _expose_for_lora(layer: torch.nn.Module) -> None:
    """With LoRA enabled, give vLLM's LoRA wrapper the tensor it looks for on a quantized layer (C19).

    vLLM 0.28 finds the device of a LoRA-wrapped layer from a tensor named ``weight``, ``weight_packed`` or
    ``qweight`` (``_get_lora_device`` in ``vllm/lora/layers/utils.py``) and refuses any other layer with
    "Unsupported base layer". The checkpoint's ``qweight`` is gone after repacking, so an empty uint8 tensor on
    the weights' device is set as ``qweight``: a plain attribute (not a parameter or buffer) that holds no
    bytes, so a layout file that later re-maps the repacked weights leaves no second copy alive. The LoRA delta
    itself is vLLM's (``PunicaWrapperCPU``, bf16), added to the output of :meth:`CpuInt4LinearMethod.apply`;
    the base weight stays 4-bit. Outside an engine (no current vLLM config) nothing is done.
    """
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None or config.lora_config is None:
        return
    packed = layer.w4a8_weight if layer.cpu_int4_kernel == "native" else layer.int4_weight
    layer.qweight = torch.empty(0, dtype=torch.uint8, device=packed.device)  # a Tensor: a plain attribute
