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

Edits, not only copies (``OMNI_SPEC_FOLLOW_EDITS``, on by default: faster on code edits, and the chat, QA and prose
floor held in a paired run of 24 pairs, docs/speculation.md; ``=0``: each draft a fresh lookup). A request that
rewrites its prompt (rename a variable, change a line) copies long runs and diverges at the edited tokens. Plain
prompt lookup loses the copy at each divergence and needs ``MIN_MATCH`` new tokens to find it again. This proposer
follows the copy instead:

- a draft continues from where the last accepted one ended in the source (the *copy*), not from a new
  lookup;
- when the model diverges after the copy ran at least :data:`MIN_RUN` tokens, the source token it
  diverged at is taken as replaced: the next drafts resume right after it (at most :data:`GUESSES` steps
  while the model writes the replacement, each written token added to it);
- once a draft from there is accepted, the replacement is learned (source token -> the tokens written in
  its place, at most :data:`MAX_SUBST`, not an insertion in front of the source token) and applied to every
  later draft of the request, so a renamed identifier is drafted with its new name; a learned replacement
  the model then rejects is forgotten.

The tokens a request generates do not depend on the drafts: the target model verifies every draft
(vLLM's rejection sampler), so greedy output is the same with or without this proposer.

Per-request state is kept by batch row and checked at every step: a row whose token count is not the
one its last step left (plus the tokens just sampled), or whose first tokens changed, is a new request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["GUESSES", "GatedPromptLookup", "MAX_COOLDOWN", "MAX_MATCH", "MAX_SUBST", "MIN_MATCH", "MIN_RUN", "START_K",
           "longest_suffix_match"]

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
MIN_RUN = 12
"""Tokens a copy must have had accepted before a divergence from it is taken as an edit (a replaced token)
rather than the end of the copy."""
GUESSES = 2
"""Steps the drafts after an edit may fail (the model still writing the replacement) before the copy is
given up."""
MAX_SUBST = 4
"""The most tokens a learned replacement of one source token may hold."""
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
    # the copy followed: the next source token's index and how many of its replacement's tokens were
    # written (src < 0: none)
    src: int = -1
    off: int = 0
    run: int = 0
    # what the last draft expected, one entry a token: (token, src, off, next src, next off), the draft
    # and then the model's own next token
    expect: list = field(default_factory=list)
    # an edit being written: (the replaced source index, the tokens written in its place); guesses left
    pending: tuple | None = None
    guesses: int = 0
    subst: dict = field(default_factory=dict)


class GatedPromptLookup:
    """vLLM ``custom_class`` proposer (see the module docstring for the rules).

    Args:
        vllm_config: the engine's ``VllmConfig``; its ``speculative_config.num_speculative_tokens`` is the
            most tokens one draft may hold, ``model_config.max_model_len`` caps drafts at the sequence end.
        min_match, start_k: override ``OMNI_SPEC_MIN_MATCH`` and ``OMNI_SPEC_START_K`` (tests).
        follow_edits: override ``OMNI_SPEC_FOLLOW_EDITS``: follow a copy through edits (the module
            docstring); False gives each draft a fresh suffix lookup.
    """

    def __init__(self, vllm_config, *, min_match: int | None = None, start_k: int | None = None,
                 follow_edits: bool | None = None) -> None:
        from omni_platform import envs

        self.min_match = max(1, envs.OMNI_SPEC_MIN_MATCH if min_match is None else min_match)
        self.start_k = max(1, envs.OMNI_SPEC_START_K if start_k is None else start_k)
        self.follow_edits = envs.OMNI_SPEC_FOLLOW_EDITS if follow_edits is None else follow_edits
        self.k_max = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.rows: dict[int, _Row] = {}
        # counters for tests and reports: propose calls, calls that drafted, requests first seen, drafts
        # made from a copy followed through an edit, replacements learned
        self.steps = 0
        self.drafting_steps = 0
        self.new_rows = 0
        self.edit_drafts = 0
        self.learned = 0

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
                self.rows[i].expect = []
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
        if self.follow_edits and row.src >= 0:
            self._follow(row, sampled, token_ids_cpu[i, : row.num_tokens])
        row.drafted = 0
        row.expect = []
        row.num_tokens = num_tokens

    def _expand(self, row: _Row, tokens: np.ndarray, n: int) -> list[tuple[int, int, int, int, int]]:
        """The next ``n`` tokens of the copy, learned replacements applied: ``(token, src, off, next src,
        next off)`` each."""
        out: list[tuple[int, int, int, int, int]] = []
        s, o = row.src, row.off
        while len(out) < n and 0 <= s < tokens.shape[0]:
            t = int(tokens[s])
            seq = row.subst.get(t, (t,))
            if o >= len(seq):
                s, o = s + 1, 0
                continue
            nxt = (s, o + 1) if o + 1 < len(seq) else (s + 1, 0)
            out.append((seq[o], s, o, *nxt))
            s, o = nxt
        return out

    def _follow(self, row: _Row, sampled: list[int], tokens: np.ndarray) -> None:
        """Move the copy past what the model wrote (``sampled``); at a divergence, guess an edit or let the
        copy go. ``tokens``: the row's tokens before ``sampled``."""
        expect = row.expect or self._expand(row, tokens, len(sampled))
        same = 0
        while same < len(sampled) and same < len(expect) and expect[same][0] == sampled[same]:
            same += 1
        if same:
            row.src, row.off = expect[same - 1][3], expect[same - 1][4]
            row.run += same
            if row.pending is not None:
                self._learn(row, tokens)
        if same == len(sampled) or same == len(expect):
            if same < len(sampled):  # the source ended under the copy
                row.src, row.pending = -1, None
            return
        wrote = int(sampled[same])
        if row.pending is not None and same == 0:  # the model is still writing the replacement
            replaced, written = row.pending
            row.guesses -= 1
            row.pending = (replaced, (*written, wrote))
            if row.guesses <= 0 or len(row.pending[1]) > MAX_SUBST:
                row.src, row.pending = -1, None
            return
        _, s, o, _, _ = expect[same]
        if row.run < MIN_RUN:
            row.src, row.pending = -1, None
            return
        t = int(tokens[s])
        written = (wrote,)
        if t in row.subst:  # a learned replacement the model did not write: forget it
            written = (*row.subst.pop(t)[:o], wrote)
        row.pending, row.guesses = (s, written), GUESSES
        row.src, row.off = s + 1, 0

    def _learn(self, row: _Row, tokens: np.ndarray) -> None:
        replaced, written = row.pending
        row.pending = None
        t = int(tokens[replaced])
        if written[-1] != t and t not in written and len(written) <= MAX_SUBST:
            row.subst[t] = written
            self.learned += 1

    def _draft(self, row: _Row, tokens: np.ndarray) -> list[int]:
        room = self.max_model_len - tokens.shape[0] - 1
        if self.follow_edits and row.src >= 0:
            guess_k = min(max(row.k, self.start_k), self.k_max)
            k = min(guess_k if row.pending is not None else row.k, room)
            if k <= 0:
                return []
            row.expect = self._expand(row, tokens, k + 1)
            draft = [e[0] for e in row.expect[:k]]
            row.drafted = len(draft)
            self.edit_drafts += row.pending is not None
            return draft
        if row.cooldown > 0:
            row.cooldown -= 1
            return []
        need = min(self.min_match + row.misses, MAX_MATCH)
        k = min(row.k, room)
        if k <= 0:
            return []
        length, end = longest_suffix_match(tokens, need, MAX_MATCH)
        if not length:
            return []
        if not self.follow_edits:
            draft = tokens[end + 1: end + 1 + k].tolist()
            row.drafted = len(draft)
            return draft
        row.src, row.off, row.run, row.pending = end + 1, 0, 0, None
        row.expect = self._expand(row, tokens, k + 1)
        draft = [e[0] for e in row.expect[:k]]
        row.drafted = len(draft)
        return draft
