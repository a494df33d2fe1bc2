"""Gated prompt lookup: a draft proposer that drafts only where drafting is likely to pay.

Plugged into vLLM through its published proposer hook, ``speculative_config={"method": "custom_class",
"model": "omni_platform.spec_proposer.GatedPromptLookup", "num_speculative_tokens": K}``
(``vllm/v1/spec_decode/custom_class_proposer.py``, vLLM 0.28, which vLLM marks experimental: the worker
builds the class from the ``VllmConfig`` and calls :meth:`GatedPromptLookup.propose` after every step).

Why gate: on a CPU of a few cores a batch-1 decode step is bound by reading the weights, and a verify
step of 1 + k rows reads them once, so an accepted draft is nearly free tokens; a rejected one costs the
verify rows' compute and attention (the speculation benchmark, docs/speculation.md: ngram with k=8 lost
on free prose where k=3 did not). vLLM's ``ngram`` method drafts whenever any 2-4-token n-gram recurs,
which in prose is often and wrong. This proposer drafts:

- only while one request decodes (with several, a step already reads the weights once for all of them);
- only after a match of at least ``OMNI_SPEC_MIN_MATCH`` tokens (default :data:`MIN_MATCH`; the longest suffix
  of the request's tokens, up to :data:`MAX_MATCH`, that occurred before; the most recent occurrence wins);
- for each request, as many tokens as its recent drafts earned: ``k`` starts at ``OMNI_SPEC_START_K``
  (default :data:`START_K`), doubles
  (up to the config's ``num_speculative_tokens``) after a draft fully accepted, falls to accepted + 1
  after a partial one;
- nothing for a request whose drafts keep failing: after ``m`` drafts in a row with nothing accepted, it
  waits ``2**m`` steps (at most :data:`MAX_COOLDOWN`), then asks for ``m`` more tokens of match (at most
  :data:`MAX_MATCH` in all) and drafts half as many tokens as before.

The tokens a request generates do not depend on the drafts: the target model verifies every draft
(vLLM's rejection sampler), so greedy output is the same with or without this proposer.

Per-request state is kept by batch row and checked at every step: a row whose token count is not the
one its last step left (plus the tokens just sampled), or whose first tokens changed, is a new request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GatedPromptLookup", "MAX_COOLDOWN", "MAX_MATCH", "MIN_MATCH", "START_K", "longest_suffix_match"]

MIN_MATCH = 3
"""Tokens of the request's latest suffix that must have occurred before for a draft (``OMNI_SPEC_MIN_MATCH``'s
default)."""
MAX_MATCH = 8
"""The longest suffix looked up (longer matches are counted as this long)."""
START_K = 4
"""Draft tokens a request starts with, capped by the config's ``num_speculative_tokens`` (``OMNI_SPEC_START_K``'s
default)."""
MAX_COOLDOWN = 64
"""The most steps a request whose drafts keep failing waits before drafting again."""
_FINGERPRINT = 8


def longest_suffix_match(tokens: np.ndarray, min_n: int, max_n: int) -> tuple[int, int]:
    """The latest earlier occurrence of the longest suffix of ``tokens`` (1-D int array) of at least
    ``min_n`` and at most ``max_n`` tokens: ``(length, end)`` where ``tokens[end]`` is the occurrence's
    last token (so ``tokens[end + 1:]`` follows it), or ``(0, -1)`` when no suffix of ``min_n`` recurs.

    Cost: one comparison of the last token with every earlier one, then at most ``max_n`` comparisons
    per candidate position (numpy)."""
    n = tokens.shape[0]
    if n < min_n + 1 or min_n < 1:
        return 0, -1
    cand = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
    if cand.size == 0:
        return 0, -1
    length = np.ones(cand.size, dtype=np.int64)
    alive = np.ones(cand.size, dtype=bool)
    for j in range(1, max_n):
        ok = alive & (cand - j >= 0)
        if not ok.any():
            break
        same = np.zeros(cand.size, dtype=bool)
        same[ok] = tokens[cand[ok] - j] == tokens[n - 1 - j]
        alive = same
        length += alive
    best = int(length.max())
    if best < min_n:
        return 0, -1
    return best, int(cand[np.flatnonzero(length == best)[-1]])


@dataclass
class _Row:
    fingerprint: tuple
    num_tokens: int
    k: int
    drafted: int = 0
    misses: int = 0
    cooldown: int = 0
    proposed: int = 0
    accepted: int = 0


class GatedPromptLookup:
    """vLLM ``custom_class`` proposer (see the module docstring for the rules).

    Args:
        vllm_config: the engine's ``VllmConfig``; its ``speculative_config.num_speculative_tokens`` is the
            most tokens one draft may hold, ``model_config.max_model_len`` caps drafts at the sequence end.
        min_match, start_k: override ``OMNI_SPEC_MIN_MATCH`` and ``OMNI_SPEC_START_K`` (tests).
    """

    def __init__(self, vllm_config, *, min_match: int | None = None, start_k: int | None = None) -> None:
        from omni_platform import envs

        self.min_match = max(1, envs.OMNI_SPEC_MIN_MATCH if min_match is None else min_match)
        self.start_k = max(1, envs.OMNI_SPEC_START_K if start_k is None else start_k)
        self.k_max = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.rows: dict[int, _Row] = {}
        # counters for tests and reports: propose calls, calls that drafted, requests first seen
        self.steps = 0
        self.drafting_steps = 0
        self.new_rows = 0

    def load_model(self, *args, **kwargs) -> None:
        """No model: the drafts come from the request's own tokens (the CPU runner calls this at load)."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None, **_) -> list[list[int]]:
        """Drafts for every row of the batch, ``[]`` where none.

        Args:
            sampled_token_ids: per row, the tokens this step emitted (1 + accepted drafts; empty for a row
                that is still prefilling).
            num_tokens_no_spec: int array ``(rows,)``: tokens of each row, the ones just sampled included.
            token_ids_cpu: int32 array ``(max_num_seqs, max_model_len)``: each row's tokens.
            slot_mappings: unused (vLLM passes it to every proposer).

        Returns:
            a list of ``len(sampled_token_ids)`` lists of token ids, each at most ``num_speculative_tokens``.
        """
        self.steps += 1
        rows = len(sampled_token_ids)
        active = [i for i in range(rows) if sampled_token_ids[i]]
        for i in list(self.rows):
            if i >= rows:
                del self.rows[i]
        for i in active:
            self._observe(i, sampled_token_ids[i], int(num_tokens_no_spec[i]), token_ids_cpu)
        drafts: list[list[int]] = [[] for _ in range(rows)]
        if len(active) != 1:
            for i in active:
                self.rows[i].drafted = 0
            return drafts
        i = active[0]
        drafts[i] = self._draft(self.rows[i], token_ids_cpu[i, : int(num_tokens_no_spec[i])])
        self.drafting_steps += bool(drafts[i])
        return drafts

    def _observe(self, i: int, sampled: list[int], num_tokens: int, token_ids_cpu: np.ndarray) -> None:
        fp = tuple(token_ids_cpu[i, : min(_FINGERPRINT, num_tokens)].tolist())
        row = self.rows.get(i)
        if row is None or row.fingerprint != fp or row.num_tokens + len(sampled) != num_tokens:
            self.new_rows += 1
            self.rows[i] = _Row(fp, num_tokens, min(self.start_k, self.k_max))
            return
        if row.drafted:
            accepted = min(len(sampled) - 1, row.drafted)
            row.proposed += row.drafted
            row.accepted += accepted
            if accepted == row.drafted:
                row.k, row.misses = min(2 * row.k, self.k_max), 0
            elif accepted > 0:
                row.k, row.misses = max(accepted + 1, 1), 0
            else:
                row.misses += 1
                row.k = max(row.k // 2, 1)
                row.cooldown = min(2 ** row.misses, MAX_COOLDOWN)
        row.drafted = 0
        row.num_tokens = num_tokens

    def _draft(self, row: _Row, tokens: np.ndarray) -> list[int]:
        if row.cooldown > 0:
            row.cooldown -= 1
            return []
        room = self.max_model_len - tokens.shape[0] - 1
        need = min(self.min_match + row.misses, MAX_MATCH)
        k = min(row.k, room)
        if k <= 0:
            return []
        length, end = longest_suffix_match(tokens, need, MAX_MATCH)
        if not length:
            return []
        draft = tokens[end + 1: end + 1 + k].tolist()
        row.drafted = len(draft)
        return draft
