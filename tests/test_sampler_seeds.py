"""C15: a seeded request samples the same tokens whatever it is batched with (omni-patches'
_patch_cpu_sampler_seeds on vLLM's CPU sampler)."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, clean_env

SAMPLER = textwrap.dedent("""
    import json, torch
    from omni_patches import apply_all
    {apply}
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    sampler = TopKTopPSampler()
    runs = []
    for global_seed in (1, 2, 3):
        torch.manual_seed(global_seed)  # the unseeded row draws from here
        logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0))
        gens = {{0: torch.Generator().manual_seed(1234)}}  # row 0 is the seeded request
        tokens, _ = sampler.forward(logits, gens, None, None)
        runs.append(tokens.tolist())
    print(json.dumps(runs))
""")


def _sample(apply: bool) -> list:
    code = SAMPLER.format(apply="apply_all()" if apply else "")
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(VLLM_PLUGINS="omni"), capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_seeded_row_is_reproducible_beside_an_unseeded_one():
    runs = _sample(apply=True)
    assert len({r[0] for r in runs}) == 1, f"seeded row changed with the global RNG: {runs}"
    assert len({r[1] for r in runs}) > 1, "the unseeded row still draws from the global generator"


def test_without_the_patch_vllm_ignores_the_seed_in_a_mixed_batch():
    """The bug the patch fixes, on this vLLM: the seeded row follows the global generator."""
    runs = _sample(apply=False)
    assert len({r[0] for r in runs}) > 1, runs


@pytest.mark.engine
def test_c15_seeded_request_beside_an_unseeded_one_gives_the_same_text(int4_model_dir):
    script = textwrap.dedent(f"""
        import json
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM(model={str(int4_model_dir)!r}, enforce_eager=True, max_model_len=256,
                      kv_cache_memory_bytes=64 << 20)
            seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=24)
            free = SamplingParams(temperature=1.0, max_tokens=24)
            texts = []
            for _ in range(3):
                outs = llm.generate(["Once upon a time", "The weather today"], [seeded, free], use_tqdm=False)
                texts.append([o.outputs[0].text for o in outs])
            print("RESULT " + json.dumps(texts), flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=clean_env(VLLM_PLUGINS="omni"), capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    texts = json.loads(lines[-1][len("RESULT "):])
    assert len({t[0] for t in texts}) == 1, texts
    assert texts[0][0]
