"""``_patch_detokenizer_prompt_mid_character``: no prompt text in the output of a prompt that ends inside a character.

A token-id prompt can end inside a multi-byte UTF-8 character (byte-level BPE splits one character over
several tokens; a client that cuts a token list, or continues a generation, does this). vLLM 0.28's
``FastIncrementalDetokenizer`` (``vllm/v1/engine/detokenizer.py``) primes tokenizers' ``DecodeStream`` with the
whole prompt; the stream's text then ends with U+FFFD, and the step that completes the character returns the
stream's whole window instead of the new character: for the prompt "日本" + half of "語", the first output
text was "日本語" (C23), streamed and not.

The replacement primes the stream with the prompt up to its last complete character (at most
:data:`MAX_TAIL` tokens back) and steps the remaining prompt tokens through it without output, so the step
that completes the character returns that character alone ("語"). Prompts that end on a character boundary
(every text prompt) keep vLLM's stream as it was built.
"""

from __future__ import annotations

from omni_patches.patches import MARKER, Patch

__all__ = ["MAX_TAIL", "PATCH", "complete_prefix_len"]

NAME = "_patch_detokenizer_prompt_mid_character"
MAX_TAIL = 8
"""Tokens looked back for a character boundary: a UTF-8 character is at most 4 bytes, each byte-level token
at least one."""


def complete_prefix_len(tokenizer, ids: list[int], skip_special_tokens: bool) -> int:
    """The length of the longest prefix of ``ids`` (at least ``len(ids) - MAX_TAIL``) whose text does not end
    inside a character; ``len(ids)`` when the prompt ends on a boundary, or when no boundary is found.

    ``tokenizer``: a ``tokenizers.Tokenizer``; only windows of at most ``MAX_TAIL`` tokens are decoded."""
    n = len(ids)
    for k in range(n, max(n - MAX_TAIL, 0) - 1, -1):
        if k == 0 or not tokenizer.decode(ids[max(0, k - MAX_TAIL):k], skip_special_tokens).endswith("\ufffd"):
            return k
    return n


def _make(original):
    def __init__(self, tokenizer, request):  # noqa: N807
        original(self, tokenizer, request)
        ids = request.prompt_token_ids
        if not ids:
            return
        k = complete_prefix_len(self.tokenizer, ids, self.skip_special_tokens)
        if k == len(ids):
            return
        import tokenizers

        self.stream = tokenizers.decoders.DecodeStream(ids=ids[:k], skip_special_tokens=self.skip_special_tokens)
        for tid in ids[k:]:
            self.stream.step(self.tokenizer, tid)  # the partial character's bytes: no text yet

    __init__.__wrapped_original__ = original
    setattr(__init__, MARKER, NAME)
    return [__init__]


PATCH = Patch(
    name=NAME,
    targets={"vllm.v1.engine.detokenizer:FastIncrementalDetokenizer.__init__":
             "7790834a246d20c195c71c14f10f68a45fca19b281bd2b829b84bd74befa0599"},
    make=_make,
    disable_env="OMNI_PATCH_DETOKENIZER_TAIL_OFF",
    doc=__doc__.split("\n")[0],
    where='`vllm/v1/engine/detokenizer.py:FastIncrementalDetokenizer.__init__`',
    bug=("a token-id prompt that ends inside a multi-byte UTF-8 character: tokenizers' `DecodeStream`,"
         ' primed with the whole prompt, returns its whole window when the character completes, so the'
         " output began with the prompt's text (C23), streamed and not. The replacement primes the "
         "stream up to the prompt's last complete character and steps the rest through it without "
         'output'),
    switch_doc='`OMNI_PATCH_DETOKENIZER_TAIL_OFF=1`',
    bug_test=('`tests/test_patch_switches.py::test_c23_detokenizer_off_puts_the_prompts_text_in_the_output`'
              " (the detokenizer of a token prompt cut inside a character of SmolLM2's tokenizer "
              "returns the prompt's text first)"),
    fix_test=('the same test (only the text after the prompt); '
              '`tests/test_fuzz_openai.py::test_c23_a_token_prompt_ending_inside_a_character_streams_what_it_answers`'
              ' (engine, streamed and not)'),
)
