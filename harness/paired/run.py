"""``python -m harness paired``: servers loaded at once, taking turns request by request, judged by the
ratios of their pairs.

    python -m harness paired --spec harness/specs/paired_speculation.json [--rounds N] --cores 0,1
        --out harness/results/paired_speculation-<UTC>.json [--allow-dirty] [--allow-busy]

A spec::

    {"description": "...", "baseline": "omni-off", "metric": "tg_tps", "band_pct": 3.0, "floor": 0.97,
     "rounds": 6, "max_tokens": 256, "settle_s": 1.5, "workloads": ["edit", "qa", "prose", "chat"],
     "arms": [{"tag": "omni-off", "server": {"kind": "omni", "model": "qwen2.5-coder-1.5b-int4",
                                              "extra": "--max-model-len 4096", "env": {"OMNI_SPECULATION": "off"}}},
              {"tag": "omni-default", "server": {...}}],
     "comparisons": [{"arm": "omni-default", "baseline": "llama-plain", "floor": 3.0}]}

An arm may name a ``reference``: the arm whose text it must equal (default the baseline; null: none, for
engines whose quantizations differ). ``comparisons`` judges further pairs, each with its own floor (a
target ratio such as "at least 3x llama.cpp").

Every arm's server (``harness.load.servers``: ``omni``, ``llama-server`` or ``command``) is started on the
same cores (``--cores``: this process is pinned and its children inherit it) and kept loaded for the
whole run; each answers one unmeasured request first. Then, ``rounds`` times, every prompt of the
workloads (``harness.workloads.prompts``) is sent to every arm in turn, one request at a time, the order
reversed from one block to the next (A B, B A, ...: a drift linear over a block cancels), with
``settle_s`` seconds of silence after each request so that the arm just measured is idle (vLLM's engine
core polls its queue for about a second after a step, ``shm_broadcast.py``) while the next one runs.
The host probe (``harness.grid.host_probe``) is read before every round.

Per request (streamed, greedy, stopping at EOS or ``max_tokens``): ``tg_tps`` = (completion tokens - 1) /
(last content chunk - first content chunk), the client's decode rate from the first token; the text.

Per workload and arm (not the baseline): the ratios arm / baseline of the blocks, their median and 95%
bootstrap interval, and the verdict (``harness.paired.stats``). The artifact also shows what separate
runs would have seen: each arm's median over the first and over the second half of the rounds beside the
host readings (``drift``), and whether each arm's text equalled the baseline's in every block
(``same_text``).

Exit status: 0 done; 2 bad arguments or a refused out path; 1 the core guard refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import provenance
from harness.paired.stats import judge_ratios

__all__ = ["decode_tps", "block_order", "load_spec", "analyse", "main"]

FORMAT_VERSION = 1
DEFAULTS = {"metric": "tg_tps", "band_pct": 3.0, "floor": 0.97, "rounds": 6, "max_tokens": 256, "settle_s": 1.5,
            "workloads": ["edit", "qa", "prose", "chat"]}


def decode_tps(completion_tokens: int, first: float | None, last: float | None) -> float | None:
    """(``completion_tokens`` - 1) / (``last`` - ``first``) tok/s, or None when there is no decode to time
    (fewer than 2 tokens, or no time between the first and the last content chunk)."""
    if first is None or last is None or completion_tokens < 2 or last <= first:
        return None
    return (completion_tokens - 1) / (last - first)


def block_order(tags: list[str], block: int) -> list[str]:
    """The arms' order in block ``block``: as listed in even blocks, reversed in odd ones (A B, B A)."""
    return list(tags) if block % 2 == 0 else list(reversed(tags))


def load_spec(path: Path) -> dict[str, Any]:
    """The spec at ``path`` with :data:`DEFAULTS` filled in.

    Raises:
        OSError: unreadable; ValueError: not JSON, fewer than two arms or repeated tags, a baseline,
            comparison or reference naming no arm, a metric other than ``tg_tps``; KeyError: an arm without a tag.
    """
    spec = {**DEFAULTS, **json.loads(path.read_text())}
    tags = [a["tag"] for a in spec.get("arms", [])]
    if len(tags) < 2 or len(set(tags)) != len(tags):
        raise ValueError(f"{path}: a paired spec needs at least two arms with distinct tags, got {tags}")
    if spec.get("baseline") not in tags:
        raise ValueError(f"{path}: baseline {spec.get('baseline')!r} is not one of the arms {tags}")
    for c in spec.get("comparisons", []):
        if c.get("arm") not in tags or c.get("baseline") not in tags:
            raise ValueError(f"{path}: comparison {c} names an arm that is not one of {tags}")
    for a in spec["arms"]:
        if a.get("reference", spec["baseline"]) not in (*tags, None):
            raise ValueError(f"{path}: arm {a['tag']}: reference {a['reference']!r} is not one of {tags}")
    if spec["metric"] != "tg_tps":
        raise ValueError(f"{path}: metric {spec['metric']!r}: the paired runner measures tg_tps only")
    return spec


def _server_spec(arm: dict[str, Any]):
    from harness.load.servers import ServerSpec

    s = arm["server"]
    model = s.get("model", "")
    if s["kind"] != "command" and model:
        from harness.models.registry import MODELS, fetch, gguf_path

        if model in MODELS:
            model = str(gguf_path(model) if s["kind"] == "llama-server" else fetch(model))
    return ServerSpec(kind=s["kind"], model=model, extra=s.get("extra", ""), env=dict(s.get("env", {})),
                      ctx_per_slot=int(s.get("ctx_per_slot", 4096)))


def _request(base: str, messages: list[dict], max_tokens: int) -> dict[str, Any]:
    from harness.load.client import chat_once, new_connector

    async def go():
        import aiohttp

        async with aiohttp.ClientSession(connector=new_connector(1)) as session:
            return await chat_once(session, base, {"model": "m", "messages": messages, "max_tokens": max_tokens,
                                                   "temperature": 0.0}, stream=True, timeout_s=1800)

    res = asyncio.run(go())
    last = res.chunk_times[-1] if res.chunk_times else None
    return {"ok": res.ok, "error": res.error, "completion_tokens": res.completion_tokens,
            "tg_tps": decode_tps(res.completion_tokens, res.first, last) if res.ok else None,
            "text": res.text, "t": time.time()}


def analyse(blocks: list[dict[str, Any]], tags: list[str], baseline: str, *, band_pct: float, floor: float,
            rounds: int, comparisons: list[dict[str, Any]] | None = None,
            references: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Verdicts, the drift view and text equality from the measured blocks.

    Args:
        blocks: ``{"round", "workload", "prompt", "arms": {tag: {"tg_tps": float | None, "text": str}}}``.
        tags, baseline: the arms and the one every other is divided by.
        band_pct, floor: as :func:`harness.paired.stats.judge_ratios`.
        rounds: rounds run (the drift view splits them in halves).
        comparisons: further pairs to judge, ``{"arm", "baseline", "floor"}`` each (an arm against a peer
            with a target ratio, e.g. ``floor`` 3.0 for "at least 3x"); judged after every arm vs ``baseline``.
        references: per arm, the arm whose text it must equal (default ``baseline``; None: not compared,
            e.g. two engines with different quantizations).

    Returns:
        ``{"verdicts": [PairVerdict dicts], "drift": {...}, "same_text": {tag: {"equal", "blocks",
        "reference"}}, "dropped": [why a block gave no ratio]}``; a workload with fewer than 2 ratios for a
        pair gets no verdict and a line in ``dropped``.
    """
    verdicts, dropped = [], []
    workloads = list(dict.fromkeys(b["workload"] for b in blocks))
    pairs = [(t, baseline, floor) for t in tags if t != baseline]
    pairs += [(c["arm"], c["baseline"], float(c.get("floor", floor))) for c in comparisons or []]
    for tag, base, fl in pairs:
        for w in workloads:
            ratios = []
            for b in (b for b in blocks if b["workload"] == w):
                a, ref = b["arms"][tag]["tg_tps"], b["arms"][base]["tg_tps"]
                if a is None or ref is None:
                    dropped.append(f"round {b['round']} {b['prompt']}: no tg_tps from "
                                   f"{tag if a is None else base}")
                    continue
                ratios.append(a / ref)
            if len(ratios) < 2:
                dropped.append(f"{tag} vs {base} on {w}: {len(ratios)} ratio(s), no verdict")
                continue
            verdicts.append(judge_ratios(tag, base, w, ratios, band_pct=band_pct, floor=fl).to_dict())
    half = max(rounds // 2, 1)
    drift: dict[str, Any] = {"host_sum_gbs": {}, "halves": {}}
    for b in blocks:
        drift["host_sum_gbs"].setdefault(str(b["round"]), b.get("host_sum_gbs"))
    for tag in tags:
        for w in workloads:
            def med(sel, tag=tag, w=w):
                v = [b["arms"][tag]["tg_tps"] for b in blocks if b["workload"] == w and sel(b["round"])
                     and b["arms"][tag]["tg_tps"] is not None]
                return float(np.median(v)) if v else None

            drift["halves"].setdefault(tag, {})[w] = {"first": med(lambda r: r < half),
                                                      "second": med(lambda r: r >= half)}
    for v in verdicts:
        for name, sel in (("first", lambda r: r < half), ("second", lambda r: r >= half)):
            rs = [b["arms"][v["arm"]]["tg_tps"] / b["arms"][v["baseline"]]["tg_tps"] for b in blocks
                  if b["workload"] == v["workload"] and sel(b["round"]) and b["arms"][v["arm"]]["tg_tps"]
                  and b["arms"][v["baseline"]]["tg_tps"]]
            v[f"median_{name}_half"] = float(np.median(rs)) if rs else None
    same = {}
    refs = {t: baseline for t in tags if t != baseline} | dict(references or {})
    for tag, ref in refs.items():
        if ref is None or ref == tag:
            continue
        differ = [f"round {b['round']} {b['prompt']}" for b in blocks
                  if b["arms"][tag]["text"] != b["arms"][ref]["text"]]
        same[tag] = {"equal": not differ, "blocks": len(blocks), "differ": differ, "reference": ref}
    return {"verdicts": verdicts, "drift": drift, "same_text": same, "dropped": dropped}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness paired", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=None, help="override the spec's rounds")
    ap.add_argument("--cores", default=None, help="CPUs to pin every arm to (default: this process's)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--allow-busy", action="store_true", help="run even when the guard finds the cores busy")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds each server may take to start")
    provenance.add_allow_dirty(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    args = _parser().parse_args(argv)
    try:
        spec = load_spec(args.spec)
    except (OSError, ValueError, KeyError) as e:
        print(f"harness paired: error: {e}", file=sys.stderr)
        return 2
    rounds = args.rounds or int(spec["rounds"])
    if rounds < 2:
        print("harness paired: error: at least 2 rounds (a ratio needs pairs)", file=sys.stderr)
        return 2
    from harness.grid import guard
    from harness.grid.bench import parse_cores
    from harness.grid.host_probe import HostProbe, spread_label

    cores = parse_cores(args.cores) if args.cores else sorted(os.sched_getaffinity(0))
    findings = guard.run_checks(cores)
    for f in findings:
        print(f"guard {f.check}: {f.level}: {f.message}")
    labels: list[str] = []
    if any(f.level == "error" for f in findings):
        if not args.allow_busy:
            print("harness paired: refusing to run (see guard errors; --allow-busy runs anyway)", file=sys.stderr)
            return 1
        labels.append("BUSY CORES: run with --allow-busy, numbers are suspect")
    prov, begun = provenance.begin_or_exit(args.out, "paired", cores=cores, allow_dirty=args.allow_dirty)
    labels += begun
    os.sched_setaffinity(0, cores)

    from harness.load.servers import start_server
    from harness.workloads.prompts import all_prompts

    tags = [a["tag"] for a in spec["arms"]]
    prompts = all_prompts(tuple(spec["workloads"]))
    servers: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    try:
        for arm in spec["arms"]:
            t0 = time.monotonic()
            servers[arm["tag"]] = start_server(_server_spec(arm), timeout_s=args.timeout)
            print(f"paired: {arm['tag']} healthy after {time.monotonic() - t0:.1f} s", flush=True)
            warm = _request(servers[arm["tag"]].base, [{"role": "user", "content": "Say hello."}], 8)
            if not warm["ok"]:
                raise RuntimeError(f"{arm['tag']}: the warm-up request failed: {warm['error']}")
        with HostProbe(cores) as probe:
            index = 0
            for r in range(rounds):
                host = probe.read()
                for p in prompts:
                    block = {"round": r, "workload": p.workload, "prompt": p.id, "host_sum_gbs": host,
                             "order": block_order(tags, index), "arms": {}}
                    for tag in block["order"]:
                        block["arms"][tag] = _request(servers[tag].base, list(p.messages), int(spec["max_tokens"]))
                        time.sleep(float(spec["settle_s"]))
                    index += 1
                    blocks.append(block)
                    print(f"paired: round {r + 1}/{rounds} {p.id}: "
                          + ", ".join(f"{t} {block['arms'][t]['tg_tps'] or float('nan'):.2f}" for t in tags),
                          flush=True)
        host_label = spread_label([b["host_sum_gbs"] for b in blocks])
        if host_label:
            labels.append(host_label)
    finally:
        for s in servers.values():
            s.stop()
    result = analyse(blocks, tags, spec["baseline"], band_pct=float(spec["band_pct"]), floor=float(spec["floor"]),
                     rounds=rounds, comparisons=spec.get("comparisons"),
                     references={a["tag"]: a["reference"] for a in spec["arms"] if "reference" in a})
    if any(not s["equal"] for s in result["same_text"].values()):
        labels.append("TEXT DIFFERS FROM THE BASELINE: see same_text")
    if prov:
        provenance.finish(prov, labels, args.out)
    artifact = {"format_version": FORMAT_VERSION, "kind": "paired", "created_unix": time.time(),
                "spec_path": str(args.spec), "spec": spec, "rounds": rounds, "guard": [vars(f) for f in findings],
                "labels": labels, "blocks": blocks, **result, "provenance": prov}
    for b in blocks:  # the texts are compared above; keep the artifact readable
        for a in b["arms"].values():
            a["text"] = a["text"][:120]
    if prov:
        provenance.write_artifact(args.out, artifact)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(artifact, indent=1) + "\n")
    for v in result["verdicts"]:
        print(f"paired: {v['arm']} / {v['baseline']} on {v['workload']}: median {v['median']:.3f} "
              f"[{v['low']:.3f}, {v['high']:.3f}] ({len(v['ratios'])} pairs): {v['verdict']}; "
              f"floor {v['floor']:.2f} {'held' if v['holds_floor'] else 'NOT held'}")
    for tag, s in result["same_text"].items():
        print(f"paired: {tag} text equal to {s['reference']}'s in every block: {s['equal']}")
    for label in labels:
        print(f"LABEL: {label}")
    print(f"artifact: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
