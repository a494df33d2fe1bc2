"""omni-quant's settings, declared in omni's settings registry when omni-quant is imported."""

from __future__ import annotations

from omni_platform import envs

__all__ = ["SETTINGS"]

SETTINGS = (
    envs.str_setting(
        "OMNI_INT4_KERNEL", "auto",
        "Which kernel multiplies cpu_int4 weights (omni-quant): native (omni's W4A8 kernel, "
        "when it was built and fits the layer), int4pack (torch's _weight_int4pack_mm_for_cpu), "
        "or auto (native where it can run, else int4pack)."),
    envs.nonneg_int_setting(
        "OMNI_INT4_DEQUANT_MIN_ROWS", None,
        "cpu_int4 with the native kernel: from this many rows (tokens in a step) on, dequantize "
        "the layer to bf16 for the step and use torch's bf16 GEMM; 0 never. Unset: measured per "
        "layer shape at load on this CPU and cached (omni_quant.runtime.kernel_choice)."),
    envs.bool_setting(
        "OMNI_INT4_HUGE_PAGES", True,
        "cpu_int4: copy the repacked weights into memory marked for transparent huge pages "
        "(omni_quant.runtime.huge_pages; decode reads them with 512x fewer TLB entries); 0 leaves them "
        "where torch allocated them."),
    envs.bool_setting(
        "OMNI_MAPPED_WEIGHTS", True,
        "cpu_int4: write each 4-bit layer, repacked for this CPU's kernel, into a layout file once and map "
        "it read-only at later starts (omni_quant.runtime.layout_cache: file pages shared between processes, no "
        "repack, no copy); 0 repacks and copies at every start."),
    envs.bool_setting(
        "OMNI_FUSED_LAYERS", True,
        "cpu_int4 on the native super-block kernel: run each Llama-family decoder layer (Qwen2, Llama) as two "
        "W4A8 ops around vLLM's attention (omni_quant.runtime.fused_layers: norms, rotary embedding and SiLU inside "
        "the ops, fewer host calls a decode step); 0 keeps vLLM's layers."),
    envs.str_setting(
        "OMNI_LAYOUT_CACHE_DIR", None,
        "cpu_int4: where layout files go when the checkpoint's directory is not writable (omni_quant."
        "layout_cache). Unset: $XDG_CACHE_HOME/omni/layouts, or ~/.cache/omni/layouts."),
)
envs.register(SETTINGS)
