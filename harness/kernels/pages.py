"""Decode's weight reads on 4 KiB pages against transparent huge pages, A/B interleaved in one process.

One decode step of a model is its linear layers at M = 1 (:data:`harness.kernels.matrix.SHAPES`, one
decoder layer's linears times the model's layer count, then the head), in the super-block layout
(:func:`omni_quant.kernels.w4a8.linear_super_blocks`, random codes and scales: the time does not depend
on the values). Two copies of the step's weights: one where torch allocated them (4 KiB pages unless
the kernel's THP mode is ``always``), one placed by :func:`omni_quant.runtime.huge_pages.place` (2 MiB
pages where the kernel's THP mode allows). The two steps alternate, ABBA, ``--steps`` times each; on
a shared host whose speed drifts, each pair of neighbours is compared, so drift cancels: the
artifact gives per-arm medians (ms a step) and the median of the paired ratios with its spread.

``python -m harness pages [--model qwen2.5-coder-1.5b] [--steps 20] [--out FILE]`` writes
``harness/results/huge_pages_gemv-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from harness import RESULTS_DIR, provenance

__all__ = ["LAYERS", "main", "step_weights"]

LAYERS = {"qwen2.5-coder-1.5b": 28, "smollm2-135m": 30}
"""Decoder layers per model (config.json's num_hidden_layers)."""


def step_weights(model: str, seed: int = 0) -> list[tuple[int, torch.Tensor, torch.Tensor]]:  # noqa: F821
    """``[(K, w, sb)]``: one decode step's linears in the super-block layout, in the order a step runs
    them (``w`` uint8 ``[N/16, K/8, 16, 4]``, ``sb`` uint8 ``[N/16, K/256, 320]``, random contents).

    Raises:
        KeyError: ``model`` is not in :data:`LAYERS`.
        ValueError: a shape's K is no multiple of 256 (the model has no super-block layout).
    """
    import torch

    from harness.kernels.matrix import SHAPES
    from omni_quant.kernels import w4a8 as native

    gen = torch.Generator().manual_seed(seed)
    layer = [s for s in SHAPES[model] if s[0] != "lm_head"]
    head = [s for s in SHAPES[model] if s[0] == "lm_head"]
    out = []
    for name, n, k, _ in layer * LAYERS[model] + head:
        if k % native.SUPER_BLOCK:
            raise ValueError(f"{model} {name}: K={k} is no multiple of {native.SUPER_BLOCK}")
        sbs = k // native.SUPER_BLOCK
        parts = (torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
                 torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
                 torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8),
                 (torch.rand(n, sbs, generator=gen) * 1e-3).half(), (torch.rand(n, sbs, generator=gen) * 1e-3).half())
        w, sb = native.repack_super_blocks(*parts)
        out.append((k, w, sb))
    return out


def _step_ms(weights, xs) -> float:
    from omni_quant.kernels import w4a8 as native

    t = time.perf_counter()
    for (_, w, sb), x in zip(weights, xs, strict=True):
        native.linear_super_blocks(x, w, sb)
    return (time.perf_counter() - t) * 1e3


def main(argv: list[str] | None = None) -> int:
    """Run the A/B and write the artifact; exit 2 without the compiled kernel or on an unknown model."""
    ap = argparse.ArgumentParser(prog="python -m harness pages", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(LAYERS))
    ap.add_argument("--steps", type=int, default=20, help="timed steps per arm (in ABBA order)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    from omni_quant.kernels import w4a8 as native
    from omni_quant.runtime import huge_pages

    if not native.available():
        print(f"the omni W4A8 kernel is not built ({native.unavailable_reason()})", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / ("huge_pages_gemv-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ".json")
    prov, labels = provenance.begin_or_exit(out, "pages", allow_dirty=args.allow_dirty)
    os.environ["OMNI_INT4_HUGE_PAGES"] = "1"
    torch.set_num_threads(args.threads)
    plain = step_weights(args.model)
    huge = [(k, huge_pages.place(w), huge_pages.place(sb)) for k, w, sb in plain]
    weight_bytes = sum(w.numel() + sb.numel() for _, w, sb in plain)
    xs = [torch.randn(1, k, dtype=torch.bfloat16) for k, _, _ in plain]
    arms = {"4k_pages": plain, "huge_pages": huge}
    for name in arms:  # warm-up: first touch, code paths
        _step_ms(arms[name], xs)
    samples: dict[str, list[float]] = {name: [] for name in arms}
    order = []
    for i in range(args.steps):
        pair = ("4k_pages", "huge_pages") if i % 2 == 0 else ("huge_pages", "4k_pages")
        for name in pair:
            samples[name].append(_step_ms(arms[name], xs))
            order.append(name)
    ratios = [h / p for h, p in zip(samples["huge_pages"], samples["4k_pages"], strict=True)]
    summary = {
        name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v),
               "gbps_at_median": weight_bytes / (statistics.median(v) * 1e-3) / 1e9}
        for name, v in samples.items()
    }
    q = statistics.quantiles(ratios, n=4)
    summary["paired_ratio_huge_over_4k"] = {"median": statistics.median(ratios), "q1": q[0], "q3": q[2],
                                             "below_1": sum(r < 1 for r in ratios), "n": len(ratios)}
    artifact = {
        "kind": "huge_pages_gemv",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": args.model,
        "linears_per_step": len(plain),
        "weight_bytes": weight_bytes,
        "threads": args.threads,
        "thp_mode": huge_pages.thp_mode(),
        "order": order,
        "samples_ms": samples,
        "summary": summary,
        "provenance": prov,
        "labels": labels,
    }
    provenance.finish(prov, labels, out)
    provenance.write_artifact(out, artifact)
    for name in arms:
        s = summary[name]
        print(f"{name:11s} median {s['median_ms']:.2f} ms a step ({s['gbps_at_median']:.1f} GB/s), "
              f"min {s['min_ms']:.2f}, max {s['max_ms']:.2f}")
    r = summary["paired_ratio_huge_over_4k"]
    print(f"huge / 4k, paired: median {r['median']:.3f} (quartiles {r['q1']:.3f}-{r['q3']:.3f}; "
          f"{r['below_1']} of {r['n']} pairs faster on huge pages); THP mode {artifact['thp_mode']}")
    print(f"artifact: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
