"""The patches, each a :class:`Patch`: a target, the fingerprint it was written for, a switch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MARKER", "Patch", "all_patches", "docs_tables"]

MARKER = "__omni_patch__"
"""Attribute set on every replacement function: its value is the patch name (idempotence)."""


@dataclass(frozen=True)
class Patch:
    """One monkey-patch.

    ``targets`` maps ``"module:Qualified.attr"`` to the sha256 of its source in the
    supported vLLM; ``make`` receives the originals (same order) and returns the
    replacements, exactly one per target in the same order (``apply_all`` refuses any other
    count and restores what it set); ``disable_env`` switches the patch off when set to ``1``.

    For docs/stability.md's two tables (:func:`docs_tables`), in Markdown: ``where`` (the targets as files and
    names), ``bug`` (the upstream bug, or "not a bug: ..."), ``switch_doc`` (how to switch it off), ``bug_test``
    (the test that shows the bug with the switch set) and ``fix_test`` (the one that shows its absence).
    """

    name: str
    targets: dict[str, str]
    make: Callable[..., list[Any]]
    disable_env: str
    doc: str
    where: str = ""
    bug: str = ""
    switch_doc: str = ""
    bug_test: str = ""
    fix_test: str = ""


def docs_tables() -> tuple[str, str]:
    """docs/stability.md's two tables from the declarations, in :func:`all_patches`' order: ``(patch, target(s),
    upstream bug, switch)`` and ``(patch, the bug with the switch set, its absence with the patch on)``."""
    declared = ["| patch | target(s) | upstream bug | switch |", "|---|---|---|---|"]
    tested = ["| patch | the bug, with the switch set | its absence, with the patch on |", "|---|---|---|"]
    for p in all_patches():
        declared.append(f"| `{p.name}` | {p.where} | {p.bug} | {p.switch_doc} |")
        tested.append(f"| `{p.name}` | {p.bug_test} | {p.fix_test} |")
    return "\n".join(declared), "\n".join(tested)


def all_patches() -> list[Patch]:
    """The twenty-one patches, in application order."""
    from omni_patches.patches.aot_cache import PATCH as AOT
    from omni_patches.patches.batch_defaults import PATCH as BATCH
    from omni_patches.patches.detokenizer_prompt_tail import PATCH as DETOKENIZER_TAIL
    from omni_patches.patches.embedding_pack import PATCH as EMBEDDING
    from omni_patches.patches.isa_probe_cache import PATCH as ISA_PROBE
    from omni_patches.patches.kv_cache import PATCH as KV
    from omni_patches.patches.kv_lazy_pages import PATCH as KV_LAZY
    from omni_patches.patches.lora_embedding import PATCH as LORA_EMBEDDING
    from omni_patches.patches.modelinfo_cache import PATCH as MODELINFO
    from omni_patches.patches.modelinfo_in_process import PATCH as MODELINFO_IN_PROCESS
    from omni_patches.patches.pipeline_parallel import PATCH as PP
    from omni_patches.patches.processor_probe import PATCH as PROCESSOR_PROBE
    from omni_patches.patches.release_memory import PATCH as RELEASE
    from omni_patches.patches.sampler_seeds import PATCH as SEEDS
    from omni_patches.patches.seeded_prefill import PATCH as SEEDED_PREFILL
    from omni_patches.patches.small_warmup import PATCH as WARMUP
    from omni_patches.patches.spec_expand import PATCH as SPEC_EXPAND
    from omni_patches.patches.speculation_default import PATCH as SPECULATION
    from omni_patches.patches.token_ids import PATCH as TOKEN_IDS
    from omni_patches.patches.tokenizer_pool import PATCH as TOKENIZER_POOL
    from omni_patches.patches.triton_key_cache import PATCH as TRITON_KEY

    return [AOT, KV, RELEASE, BATCH, SEEDS, WARMUP, PP, MODELINFO, TOKEN_IDS, EMBEDDING, TOKENIZER_POOL,
            PROCESSOR_PROBE, MODELINFO_IN_PROCESS, SPECULATION, SEEDED_PREFILL,
            LORA_EMBEDDING, SPEC_EXPAND, DETOKENIZER_TAIL, KV_LAZY, ISA_PROBE, TRITON_KEY]
