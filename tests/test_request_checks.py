"""C12: token ids outside the vocabulary are refused at the door; the engine keeps serving."""

import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, clean_env
from omni_platform.request_checks import TokenIdOutOfRange, check_token_ids


class _Params:
    def __init__(self, **kw):
        self.stop_token_ids = kw.get("stop_token_ids")
        self.allowed_token_ids = kw.get("allowed_token_ids")
        self.logit_bias = kw.get("logit_bias")


def _prompt(ids):
    return {"type": "token", "prompt_token_ids": ids}


def _bad_words(token_ids):
    """vLLM's own SamplingParams after its tokenizer turned ``bad_words`` into ``token_ids``."""
    from vllm import SamplingParams

    sp = SamplingParams(bad_words=["x"] * len(token_ids))
    sp._bad_words_token_ids = token_ids
    return sp


@pytest.mark.parametrize("inputs, params, field, bad", [
    (_prompt([1, 49152]), _Params(), "prompt_token_ids", 49152),
    (_prompt([-1]), _Params(), "prompt_token_ids", -1),
    (_prompt([1]), _Params(stop_token_ids=[2, 10**9]), "stop_token_ids", 10**9),
    (_prompt([1]), _Params(allowed_token_ids=[49153]), "allowed_token_ids", 49153),
    (_prompt([1]), _Params(logit_bias={5: 1.0, 60000: -1.0}), "logit_bias", 60000),
    ({"type": "enc_dec", "encoder_prompt": _prompt([99999]), "decoder_prompt": _prompt([1])}, _Params(),
     "prompt_token_ids", 99999),
    (_prompt([1]), _bad_words([[5, 6], [70000]]), "bad_words", 70000),
])
def test_the_first_bad_id_is_named_with_its_field_and_the_vocabulary(inputs, params, field, bad):
    with pytest.raises(TokenIdOutOfRange) as e:
        check_token_ids(inputs, params, 49152)
    assert e.value.parameter == field and e.value.value == bad
    assert f"{field} holds token id {bad}" in str(e.value) and "vocabulary of 49152" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_ids_inside_the_vocabulary_pass():
    check_token_ids(_prompt([0, 49151]), _Params(stop_token_ids=[0], allowed_token_ids=[49151],
                                                  logit_bias={7: 1.0}), 49152)
    check_token_ids({"type": "embeds", "prompt_embeds": None}, object(), 49152)  # no ids, nothing to check


@pytest.mark.engine
def test_c12_vllm_llm_refuses_bad_ids_and_keeps_generating(int4_model_dir):
    """Default layout (the engine core in this process) and vLLM's own: ValueError, then the next request works."""
    script = textwrap.dedent(f"""
        import json
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        if __name__ == "__main__":
            llm = LLM(model={str(int4_model_dir)!r}, enforce_eager=True, max_model_len=256,
                      kv_cache_memory_bytes=64 << 20)
            sp = SamplingParams(temperature=0.0, max_tokens=8)
            before = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], sp, use_tqdm=False)[0].outputs[0].text
            errors = []
            for prompt, params in (([1, 49152], sp), ([1, 2], SamplingParams(max_tokens=4, min_tokens=2,
                                                                             stop_token_ids=[10**6])),
                                   ([1, 2], SamplingParams(max_tokens=4, allowed_token_ids=[5, 10**12])),
                                   ([1, 2], SamplingParams(max_tokens=4, logit_bias={{-5: 1.0}}))):
                try:
                    llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
                    errors.append(None)
                except ValueError as e:
                    errors.append(str(e))
            after = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], sp, use_tqdm=False)[0].outputs[0].text
            print("RESULT " + json.dumps({{"before": before, "after": after, "errors": errors}}), flush=True)
    """)
    import json

    for layout in ({}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}):
        proc = subprocess.run([sys.executable, "-c", script], env=clean_env(VLLM_PLUGINS="omni", **layout),
                              capture_output=True, text=True, timeout=600, cwd=REPO)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
        out = json.loads(lines[-1][len("RESULT "):])
        assert out["errors"][0] and "prompt_token_ids holds token id 49152" in out["errors"][0]
        assert out["errors"][1] and "stop_token_ids holds token id 1000000" in out["errors"][1]
        assert out["errors"][2] and "allowed_token_ids holds token id 1000000000000" in out["errors"][2]
        assert out["errors"][3] and "logit_bias holds token id -5" in out["errors"][3]
        assert all("vocabulary of 49152" in e for e in out["errors"])
        assert out["after"] == out["before"] and out["after"]
