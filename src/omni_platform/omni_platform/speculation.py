"""Speculative decoding on small machines, on by default (``OMNI_SPECULATION=auto``): the decision alone, no
vLLM import.

On a CPU of a few cores, batch-1 decode of 4-bit weights is bound by the bytes of weights read per
token, and a verify step of 1 + k rows reads them once: omni's W4A8 kernel costs about the same for a
handful of rows as for one (docs/cpu_int4.md). Prompt lookup drafts from the request's own tokens, needs
no second model and no memory. vLLM's own ``ngram`` method lost on some workloads in earlier runs; omni's
gated prompt lookup (:mod:`omni_platform.spec_proposer`) drafts only after a match of several tokens, sizes
each request's drafts by what its earlier drafts earned, stops drafting for a request whose drafts keep
failing, and drafts nothing while several requests decode (with several streams each step already reads
the weights once for all of them). The paired speculation benchmark
(``harness/specs/paired_speculation.json``, docs/speculation.md) decided it: no workload's 95% interval of
its ratio to the plain engine below 0.97. :func:`default_speculative_config` gives it where the user chose
none.
"""

from __future__ import annotations

__all__ = ["CHOSEN", "CHOSEN_FROM", "default_speculative_config", "why_not"]

PROPOSER = "omni_platform.spec_proposer.GatedPromptLookup"
"""vLLM's ``custom_class`` proposer omni drafts with (``omni_platform.spec_proposer``)."""

CHOSEN: dict = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 8}
"""The setting the paired speculation benchmark judged (docs/speculation.md names the artifact): gated prompt
lookup, up to 8 draft tokens, drafting only while one request decodes (the proposer's own rule)."""

CHOSEN_FROM = "harness/results/paired_speculation-*.json: see docs/speculation.md"
"""Where the choice was measured, for the log line."""


def why_not(*, physical_cores: int, few_cpus: int, mode: str, user_config: bool, logits_processors: bool,
            runner_type: str, parallel: int = 1) -> str | None:
    """Why an engine gets no default speculation, or None when it gets :data:`CHOSEN`.

    Args:
        physical_cores: physical cores this process may use.
        few_cpus: ``OMNI_FEW_CPUS``, the largest machine called small.
        mode: ``OMNI_SPECULATION`` (``auto`` or ``off``).
        user_config: the user passed a speculative config (or ``--spec-method``/``--spec-model``/``--spec-tokens``).
        logits_processors: the user passed custom logits processors (vLLM rejects them under speculation).
        runner_type: the model config's ``runner_type`` (only ``generate`` decodes).
        parallel: ``tensor_parallel_size * pipeline_parallel_size``: the default is for one worker (omni's
            small-machine layout); a split model is left as the user configured it.
    """
    if mode == "off":
        return "OMNI_SPECULATION=off"
    if user_config:
        return "the engine arguments name a speculative config"
    if logits_processors:
        return "custom logits processors are set (vLLM 0.28 refuses them with speculative decoding)"
    if runner_type != "generate":
        return f"the model runs as {runner_type!r}, not 'generate'"
    if parallel > 1:
        return f"the model is split over {parallel} workers (tensor or pipeline parallel)"
    if physical_cores > few_cpus:
        return f"{physical_cores} physical cores > OMNI_FEW_CPUS={few_cpus}"
    return None


def default_speculative_config(max_num_seqs: int | None = None) -> dict:
    """:data:`CHOSEN` as a new dict, shaped as ``vllm.LLM(speculative_config=...)`` takes it.

    ``max_num_seqs`` is not used: the gated proposer itself drafts nothing while several requests decode
    (vLLM's batch-size schedule ``num_speculative_tokens_per_batch_size`` is not needed; the earlier ngram
    default used it)."""
    return dict(CHOSEN)
