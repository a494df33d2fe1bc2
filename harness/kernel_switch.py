"""Where (if anywhere) prefill should leave the 4-bit kernel: int4 GEMM vs dequantize + bf16 GEMM.

    python harness/kernel_switch.py [--threads 2] [--rows 1,2,4,8,16,32,64,128,256,512]

For SmolLM2-135M's linear shapes (N x K: 576x576, 192x576, 1536x576, 576x1536 and the
49152x576 head), times per row count M (median of repeats, microseconds):
``int4``: ``aten._weight_int4pack_mm_for_cpu``; ``dequant+bf16``: dequantize the 4-bit
weight to bf16 (the work a prefill path would do per call, since no bf16 copy may stay
resident) then ``F.linear``; ``bf16``: ``F.linear`` on a resident bf16 weight (the cost
of keeping a second layout, for reference). Prints the table and, per shape, the
smallest M at which dequant+bf16 wins (or "none"). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

__all__ = ["main"]

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]


def _time(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernel_switch.py", description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64,128,256,512")
    ap.add_argument("--group-size", type=int, default=64)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from omni_quant.packing import pack, unpack
    from omni_quant.quant_math import dequantize, quantize

    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    out = {}
    for n, k in SHAPES:
        w = torch.randn(n, k, dtype=torch.bfloat16)
        q, s, z = quantize(w, args.group_size, refine_steps=0)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        sz = torch.stack([s.T, z.T], -1).contiguous()
        nib = pack(q)
        reps = 5 if n > 10000 else 15
        t_deq = _time(lambda nib=nib, s=s, z=z: dequantize(unpack(nib), s, z), max(3, reps // 3))
        table = []
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16)
            t4 = _time(lambda x=x, packed=packed, sz=sz: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, packed, args.group_size, sz), reps)
            tb = _time(lambda x=x, w=w: F.linear(x, w), reps)
            table.append({"m": m, "int4_us": t4, "bf16_us": tb, "dequant_bf16_us": t_deq + tb})
            print(f"{n:6d}x{k:<5d} M={m:4d}  int4 {t4:10.1f}  dequant+bf16 {t_deq + tb:10.1f}  bf16 {tb:10.1f} us",
                  flush=True)
        wins = [r["m"] for r in table if r["dequant_bf16_us"] < r["int4_us"]]
        out[f"{n}x{k}"] = {"switch_m": min(wins) if wins else None, "rows": table}
        print(f"  -> dequant+bf16 wins from M={min(wins)}" if wins else "  -> dequant+bf16 never wins")
    print(json.dumps({"threads": args.threads, "group_size": args.group_size, "shapes": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
