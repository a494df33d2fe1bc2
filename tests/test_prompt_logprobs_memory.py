"""C29: an 1800-token prompt with ``prompt_logprobs=1`` on a small machine answers within the memory plan.

The plan: vLLM computes prompt logprobs step by step as chunked prefill feeds the prompt, so the peak above
the engine's steady resident set is bounded by one step's logits, not by the prompt: at most three float32
copies of ``max_num_batched_tokens x vocab`` (the logits, their log-softmax, the gathered copy), 3 x 512 x
49152 x 4 B = 288 MiB for SmolLM2 under omni's small-machine step budget. A prompt scored in one piece would
need 1800 / 512 times that."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import clean_env

pytestmark = pytest.mark.engine

PROBE = r"""
import json, sys, psutil
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key):
            return int(line.split()[1])

def main():
    llm = LLM(model=sys.argv[1], max_model_len=2048, enforce_eager=True)
    me = psutil.Process()
    pids = [me.pid] + [c.pid for c in me.children(recursive=True)]
    ids = list(range(1000, 2800))
    llm.generate([TokensPrompt(prompt_token_ids=ids[:100])], SamplingParams(max_tokens=2, prompt_logprobs=1),
                 use_tqdm=False)
    steady = {p: kib(p, "VmRSS") for p in pids}
    for p in pids:
        with open(f"/proc/{p}/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current resident set
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=4, prompt_logprobs=1),
                       use_tqdm=False)[0]
    rise = max(kib(p, "VmHWM") - steady[p] for p in pids)
    cfg = llm.llm_engine.vllm_config
    print("PROBE " + json.dumps({
        "scored": sum(lp is not None for lp in out.prompt_logprobs), "generated": len(out.outputs[0].token_ids),
        "rise_kib": rise, "step_tokens": cfg.scheduler_config.max_num_batched_tokens,
        "vocab": cfg.model_config.get_vocab_size()}))

if __name__ == "__main__":
    main()
"""


def test_c29_long_prompt_logprobs_stay_within_one_steps_logits(int4_model_dir):
    out = subprocess.run([sys.executable, "-c", PROBE, str(int4_model_dir)], env=clean_env(VLLM_PLUGINS="omni"),
                         capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert out.returncode == 0 and line, out.stderr[-3000:]
    r = json.loads(line[len("PROBE "):])
    plan_kib = 3 * r["step_tokens"] * r["vocab"] * 4 // 1024
    print(f"prompt logprobs: {r['scored']} scored, peak {r['rise_kib'] // 1024} MiB above steady; "
          f"plan {plan_kib // 1024} MiB (step budget {r['step_tokens']})")
    assert r["scored"] == 1799 and r["generated"] == 4  # every prompt token but the first has a logprob
    assert r["rise_kib"] <= plan_kib, f"peak {r['rise_kib'] // 1024} MiB above steady, plan {plan_kib // 1024} MiB"
