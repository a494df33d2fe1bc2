"""Fidelity of a quantized checkpoint against its bf16 reference, through vLLM.

    python -m harness fidelity --ref BF16_DIR --test INT4_DIR [--gen-len 32] [--json]

On the prompt set shipped in ``harness/data/fidelity_prompts.json``:
- the reference generates a greedy continuation of ``gen_len`` tokens per prompt;
- teacher-forced next-token **top-1 agreement**: over every continuation position
  of the reference's sequences, the fraction where the test model's most likely next
  token equals the reference's (both read with vLLM's ``prompt_logprobs``);
- **mean KL(ref || test)** over those positions, on the reference's top-20 tokens
  renormalized (vLLM returns at most 20 log-probabilities: an approximation, said so);
- **exact match**: the fraction of prompts whose greedy ``gen_len``-token continuation
  from the test model equals the reference's token for token.

Each model runs in its own subprocess (its own engine), with ``VLLM_PLUGINS=omni``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, provenance

__all__ = ["compare", "main"]

PROMPTS = REPO / "harness" / "data" / "fidelity_prompts.json"
TOP = 20


def _engine(model: str, prompts: list[str], gen_len: int, sequences: list[list[int]] | None, out: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, enforce_eager=True, max_model_len=1024, max_num_seqs=8, max_logprobs=TOP)
    tok = llm.get_tokenizer()
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    greedy = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids],
                          SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True), use_tqdm=False)
    gen = [list(o.outputs[0].token_ids) for o in greedy]
    seqs = sequences or [p + g for p, g in zip(prompt_ids, gen, strict=False)]
    scored = llm.generate([TokensPrompt(prompt_token_ids=s) for s in seqs],
                          SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP), use_tqdm=False)
    dists = []
    for o in scored:
        rows = []
        for pos in (o.prompt_logprobs or [])[1:]:
            rows.append({str(t): lp.logprob for t, lp in (pos or {}).items()})
        dists.append(rows)
    Path(out).write_text(json.dumps({"prompt_ids": prompt_ids, "generated": gen, "sequences": seqs, "dists": dists}))


def _run_engine(model: str, gen_len: int, sequences: list[list[int]] | None) -> dict:
    prompts = json.loads(PROMPTS.read_text())["prompts"]
    with tempfile.TemporaryDirectory() as tmp:
        args_path, out = Path(tmp) / "args.json", Path(tmp) / "out.json"
        args_path.write_text(json.dumps({"model": model, "prompts": prompts, "gen_len": gen_len,
                                         "sequences": sequences}))
        env = {**os.environ, "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS", "omni")}
        proc = subprocess.run([sys.executable, "-m", "harness.models.fidelity", "_engine", str(args_path), str(out)],
                              env=env, capture_output=True, text=True, cwd=REPO)
        if proc.returncode != 0:
            raise RuntimeError(f"fidelity engine for {model} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def compare(ref: dict, test: dict) -> dict:
    """Top-1 agreement, mean top-20 KL and exact match from two engine outputs (same sequences)."""
    agree = total = 0
    kls: list[float] = []
    for seq, p_rows, q_rows, n_prompt in zip(ref["sequences"], ref["dists"], test["dists"],
                                              (len(p) for p in ref["prompt_ids"]), strict=False):
        # row i predicts token i+1; continuation positions predict tokens n_prompt .. end
        for i in range(n_prompt - 1, len(seq) - 1):
            p, q = p_rows[i], q_rows[i]
            if not p or not q:
                continue
            total += 1
            agree += max(p, key=p.get) == max(q, key=q.get)
            zp = math.log(sum(math.exp(v) for v in p.values()))
            kl = 0.0
            floor = min(q.values()) - 2.0  # a token outside the test's top-20: below its 20th
            for t, lp in p.items():
                pn = lp - zp
                kl += math.exp(pn) * (pn - q.get(t, floor))
            kls.append(max(kl, 0.0))
    exact = sum(a == b for a, b in zip(ref["generated"], test["generated"], strict=False))
    return {
        "top1_agreement": agree / total if total else float("nan"),
        "positions": total,
        "mean_kl_top20": sum(kls) / len(kls) if kls else float("nan"),
        "exact_match": exact / len(ref["generated"]),
        "exact_match_count": f"{exact}/{len(ref['generated'])}",
        "gen_len": len(ref["generated"][0]) if ref["generated"] else 0,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_engine":
        a = json.loads(Path(argv[1]).read_text())
        _engine(a["model"], a["prompts"], a["gen_len"], a["sequences"], argv[2])
        return 0
    ap = argparse.ArgumentParser(prog="python -m harness fidelity", description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None,
                    help="also write the result as an artifact (JSON with its provenance and omni settings)")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    # both checkpoints' digests: the artifact names exactly what was compared
    prov, labels = provenance.begin_or_exit(args.out, "fidelity", checkpoints=(args.ref, args.test),
                                            allow_dirty=args.allow_dirty)
    ref = _run_engine(args.ref, args.gen_len, None)
    test = _run_engine(args.test, args.gen_len, ref["sequences"])
    result = compare(ref, test)
    print(f"top-1 agreement {result['top1_agreement']:.3f} over {result['positions']} positions; "
          f"mean KL (top-20) {result['mean_kl_top20']:.4f}; exact {args.gen_len}-token match "
          f"{result['exact_match_count']}")
    print(json.dumps({**result, "ref": args.ref, "test": args.test}))
    if args.out is not None:
        from harness.models.bpw import bits_per_weight

        try:
            bits = bits_per_weight(args.test)
        except ValueError:
            bits = None  # a bf16 or foreign checkpoint: no quantization report to read
        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {
            "kind": "fidelity", "created_unix": time.time(),
            "result": {**result, "ref": args.ref, "test": args.test, "gen_len": args.gen_len},
            "test_bits_per_weight": bits,
            "omni_env": {k: v for k, v in os.environ.items() if k.startswith(("OMNI_", "VLLM_PLUGINS"))},
            "provenance": prov, "labels": labels,
        })
        print(f"artifact: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
