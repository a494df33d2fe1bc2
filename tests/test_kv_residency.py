"""The long request of ``harness run-kv-residency``: as many tokens as asked (the real tokenizer), none repeated
line by line (no prefix-cache reuse inside it)."""

from transformers import AutoTokenizer

from harness.load.kv_residency import long_prompt


def test_the_long_prompt_has_the_tokens_asked_for_and_distinct_lines(int4_model_dir):
    tok = AutoTokenizer.from_pretrained(str(int4_model_dir))
    text = long_prompt(tok, 3000)
    n = len(tok(text)["input_ids"])
    assert 3000 <= n <= 3000 + 25 * 20, n
    lines = text.splitlines()[:-1]
    assert len(set(lines)) == len(lines)
