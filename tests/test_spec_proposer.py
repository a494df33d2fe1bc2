"""The gated prompt-lookup proposer's rules (omni_platform/spec_proposer.py), step by step on synthetic
batches shaped as vLLM 0.28's worker hands them over (per-row sampled tokens, token counts, the token
table), and its suffix matcher against a brute-force reference. Greedy equality in a real engine:
tests/test_speculation.py (method ``gated``)."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_platform.spec_proposer import GUESSES, MIN_RUN, START_K, GatedPromptLookup, longest_suffix_match

MAX_LEN = 256


def _proposer(k=8, max_len=MAX_LEN, follow_edits=True, **kw):
    """The proposer under test; following edits on (``OMNI_SPEC_FOLLOW_EDITS``'s default), unless asked otherwise:
    the rules before it apply either way."""
    return GatedPromptLookup(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                             model_config=SimpleNamespace(max_model_len=max_len)),
                             follow_edits=follow_edits, **kw)


class Batch:
    """Rows of tokens as the worker keeps them: a table and a count per row."""

    def __init__(self, *rows):
        self.table = np.zeros((4, MAX_LEN), dtype=np.int32)
        self.n = np.zeros(4, dtype=np.int64)
        for i, r in enumerate(rows):
            self.table[i, : len(r)] = r
            self.n[i] = len(r)
        self.rows = len(rows)

    def step(self, prop, sampled):
        """Append each row's sampled tokens, then ask for drafts."""
        for i, s in enumerate(sampled):
            self.table[i, self.n[i]: self.n[i] + len(s)] = s
            self.n[i] += len(s)
        return prop.propose([list(s) for s in sampled], self.n[: self.rows], self.table)


def _brute(tokens, min_n, max_n):
    n = len(tokens)
    for length in range(min(max_n, n - 1), min_n - 1, -1):
        suffix = tokens[n - length:]
        for end in range(n - 2, length - 2, -1):
            if tokens[end - length + 1: end + 1] == suffix:
                return length, end
    return 0, -1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=0, max_size=40), st.integers(1, 4), st.integers(4, 9))
def test_the_matcher_finds_the_latest_occurrence_of_the_longest_suffix(tokens, min_n, max_n):
    got = longest_suffix_match(np.array(tokens, dtype=np.int32), min_n, max_n)
    assert got == _brute(tokens, min_n, max_n)


def test_a_repeated_text_is_drafted_and_full_acceptance_doubles_the_draft():
    text = list(range(10, 40))
    prop, b = _proposer(), Batch(text + text[:5])  # the last 5 tokens occurred at the start
    (d,) = b.step(prop, [[text[5]]])
    assert d == text[6: 6 + START_K]
    (d,) = b.step(prop, [d + [text[6 + START_K]]])  # every draft accepted, plus the bonus token
    k = 2 * START_K
    assert d == text[7 + START_K: 7 + START_K + k]


def test_a_partial_acceptance_shrinks_the_draft_to_what_was_earned():
    text = list(range(10, 40))
    prop, b = _proposer(), Batch(text + text[:5])
    (d,) = b.step(prop, [[text[5]]])
    (d,) = b.step(prop, [[d[0], 99]])  # one accepted, then the model went its own way
    assert d == []  # "..., 99" has no 3-token match
    assert prop.rows[0].k == 2


def test_drafts_that_keep_failing_cool_the_request_down_and_raise_the_match_it_needs():
    pattern = [1, 2, 3, 4, 5, 6]
    prop, b = _proposer(), Batch(pattern * 4)
    (d,) = b.step(prop, [[1]])
    assert d  # "... 5 6 1" recurs: a draft
    (d,) = b.step(prop, [[77]])  # nothing accepted
    row = prop.rows[0]
    assert d == [] and row.misses == 1 and row.cooldown == 1  # 2**1 steps without drafts, one spent now
    assert b.step(prop, [[1]]) == [[]]
    row.misses = 6  # after many misses the match must be min(MIN_MATCH + 6, MAX_MATCH) = 8 tokens long
    assert b.step(prop, [[2]]) == [[]]  # "... 77 1 2": the 2-token match "1 2" is not enough
    assert b.step(prop, [[3]]) == [[]]  # "1 2 3" (3 tokens) recurs, but 8 are needed now
    row.misses = 0
    assert b.step(prop, [[4]])[0] == [5, 6]  # "1 2 3 4" recurs: enough again; k was halved by the miss


def test_nothing_is_drafted_while_several_requests_decode():
    text = list(range(10, 40))
    prop, b = _proposer(), Batch(text + text[:5], text + text[:5])
    assert b.step(prop, [[text[5]], [text[5]]]) == [[], []]
    # the second request still prefilling (no sampled token): the first one decodes alone and drafts
    d = b.step(prop, [[text[6]], []])
    assert d[0] and d[1] == []


def test_a_new_request_in_a_row_starts_afresh():
    text = list(range(10, 40))
    prop, b = _proposer(), Batch(text + text[:5])
    b.step(prop, [[text[5]]])
    prop.rows[0].misses, prop.rows[0].cooldown = 3, 8
    b2 = Batch(list(range(100, 130)) + list(range(100, 105)))  # another request took row 0
    d = b2.step(prop, [[105]])
    assert prop.rows[0].misses == 0 and d[0] == list(range(106, 106 + START_K))
    assert prop.new_rows == 2


def test_drafts_stop_at_the_models_length():
    text = list(range(10, 40))
    prop, b = _proposer(max_len=38), Batch(text + text[:5])
    (d,) = b.step(prop, [[text[5]]])  # 36 tokens: room for 38 - 36 - 1 = 1 draft token
    assert d == text[6:7]


def test_the_match_and_first_draft_lengths_come_from_omnis_settings(monkeypatch):
    monkeypatch.setenv("OMNI_SPEC_MIN_MATCH", "2")
    monkeypatch.setenv("OMNI_SPEC_START_K", "2")
    prop = _proposer()
    assert (prop.min_match, prop.start_k) == (2, 2)
    b = Batch([5, 6, 9, 9, 9, 9, 5])
    assert b.step(prop, [[6]]) == [[9, 9]]  # "5 6" recurs: two tokens of match are enough now
    monkeypatch.setenv("OMNI_SPEC_MIN_MATCH", "3")
    assert Batch([5, 6, 9, 9, 9, 9, 5]).step(_proposer(), [[6]]) == [[]]


def _replay(prop, prompt, output, max_len=MAX_LEN):
    """Decode ``output`` after ``prompt`` as vLLM's rejection sampler would with greedy drafts: each step
    emits the accepted prefix of the draft plus the model's own next token. Returns ``[(draft, accepted)]``."""
    b = Batch(prompt)
    steps, pos, sampled = [], 1, [output[0]]
    while pos < len(output):
        (d,) = b.step(prop, [sampled])
        a = 0
        while a < len(d) and pos + a < len(output) and d[a] == output[pos + a]:
            a += 1
        sampled = output[pos: pos + a + 1]
        pos += len(sampled)
        steps.append((d, a))
    return steps


# a 60-token "function" whose token 20 (an identifier) recurs at 35 and 50; the edit renames it to two tokens
SOURCE = list(range(100, 160))
NAME = SOURCE[20]
SOURCE[35] = SOURCE[50] = NAME
RENAMED = [w for t in SOURCE for w in ((900, 901) if t == NAME else (t,))]
PROMPT = SOURCE + [1, 2] + SOURCE[:3]  # the source, an instruction, the answer's first tokens


def test_an_edit_inside_a_long_copy_is_followed_and_the_replacement_learned():
    prop = _proposer(k=8)
    steps = _replay(prop, PROMPT, RENAMED[3:] + [7])
    row = prop.rows[0]
    assert row.subst == {NAME: (900, 901)}  # learned once the copy resumed after it
    assert prop.learned == 1 and prop.edit_drafts >= 1
    # the third occurrence is drafted under its new name, inside a longer draft
    assert any(900 in d and 901 in d and a == len(d) for d, a in steps)


def test_the_same_edit_without_following_needs_more_steps():
    follow = _replay(_proposer(k=8), PROMPT, RENAMED[3:] + [7])
    plain = _replay(_proposer(k=8, follow_edits=False), PROMPT, RENAMED[3:] + [7])
    assert len(follow) < len(plain)


def test_a_divergence_after_a_short_copy_ends_it_without_a_guess():
    text = list(range(10, 40))
    prop, b = _proposer(), Batch(text + text[:5])
    (d,) = b.step(prop, [[text[5]]])
    (d,) = b.step(prop, [[d[0], 99]])  # one token accepted: the copy ran < MIN_RUN tokens
    assert prop.rows[0].src == -1 and prop.rows[0].pending is None and d == []


def test_a_guess_that_keeps_failing_gives_the_copy_up():
    # a long copy, then the model writes tokens that are nowhere in the source
    output = SOURCE[3:3 + MIN_RUN + 4] + [700, 701, 702, 703, 704, 705]
    prop = _proposer(k=8)
    steps = _replay(prop, PROMPT, output)
    guesses = [d for d, a in steps if d and d[0] not in (700, 701, 702)]
    assert prop.rows[0].src == -1 and prop.rows[0].pending is None
    assert prop.edit_drafts == GUESSES and guesses


def test_a_learned_replacement_the_model_then_rejects_is_forgotten():
    prop = _proposer(k=8)
    # renamed at its first two occurrences, kept at the third
    out = [w for i, t in enumerate(SOURCE) for w in ((900, 901) if t == NAME and i < 40 else (t,))]
    _replay(prop, PROMPT, out[3:] + [7])
    assert prop.learned == 1 and NAME not in prop.rows[0].subst


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=4, max_size=60), st.lists(st.integers(0, 8), min_size=2, max_size=80),
       st.integers(1, 12))
def test_drafts_are_bounded_whatever_the_model_writes(prompt, output, k):
    prop = _proposer(k=k)
    for d, _ in _replay(prop, prompt, output):
        assert len(d) <= k and all(isinstance(t, int) for t in d)
