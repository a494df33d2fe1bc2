"""Bits per weight of quantized models, measured from the files: ``python -m harness bpw PATH ... [--out ARTIFACT]``.

One definition for every format: the bytes of the linear layers' weights and their quantization
constants, times 8, over their weight count; the output head counts, the input embedding (a lookup,
which cpu_int4 keeps in bf16) does not.

- a cpu_int4 or GPTQ checkpoint written by ``omni-quant convert``: from its
  ``quantization_report.json`` (the converter's own byte count per tensor);
- a llama.cpp ``.gguf``: every 2-D tensor but ``token_embd.weight``, its bytes as stored (the
  ``gguf`` package's ``n_bytes``; K-quant super-block scales included), and the count per type.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

from harness import provenance

__all__ = ["bits_per_weight", "main"]


def bits_per_weight(path: str | os.PathLike[str]) -> dict:
    """``{"path", "format", "bits_per_weight", "weights", "bytes", "types"}`` for one model.

    ``types`` counts the tensors per stored type (GGUF: ``Q4_K``, ``Q6_K``, ...; a checkpoint:
    ``4-bit g32``, ``8-bit``).

    Raises:
        ValueError: ``path`` is neither a ``.gguf`` file nor a directory with ``quantization_report.json``.
    """
    p = Path(path)
    if p.suffix == ".gguf" and p.is_file():
        from gguf import GGMLQuantizationType, GGUFReader

        weights = nbytes = 0
        types: Counter[str] = Counter()
        for t in GGUFReader(str(p)).tensors:
            if len(t.shape) != 2 or t.name == "token_embd.weight":
                continue
            weights += int(t.n_elements)
            nbytes += int(t.n_bytes)
            types[GGMLQuantizationType(t.tensor_type).name] += 1
        return {"path": str(p), "format": "gguf", "bits_per_weight": 8 * nbytes / weights, "weights": weights,
                "bytes": nbytes, "types": dict(types)}
    report = p / "quantization_report.json"
    if not report.is_file():
        raise ValueError(f"{p}: neither a .gguf file nor a checkpoint with quantization_report.json "
                         "(convert it with `omni-quant convert` first)")
    r = json.loads(report.read_text())
    rows = [t for t in r["tensors"] if t.get("group_size") is not None]
    types = Counter(f"{t.get('bits') or 4}-bit" + (f" g{t['group_size']}" if (t.get("bits") or 4) == 4 else "")
                    for t in rows)
    return {"path": str(p), "format": "cpu_int4", "recipe": r.get("recipe"),
            "bits_per_weight": r["bits_per_weight"], "weights": sum(t["shape"][0] * t["shape"][1] for t in rows),
            "bytes": sum(t["bytes_out"] for t in rows), "types": dict(types)}


def main(argv: list[str] | None = None) -> int:
    """Print one line per model and optionally write them as an artifact; exit 2 on a path it cannot read."""
    ap = argparse.ArgumentParser(prog="python -m harness bpw", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as an artifact (JSON)")
    provenance.add_allow_dirty(ap)
    args = ap.parse_args(argv)
    prov, labels = provenance.begin_or_exit(args.out, "bpw", checkpoints=tuple(args.paths),
                                            allow_dirty=args.allow_dirty)
    try:
        rows = [bits_per_weight(p) for p in args.paths]
    except ValueError as e:
        print(f"harness bpw: error: {e}", file=sys.stderr)
        return 2
    for row in rows:
        print(f"{row['bits_per_weight']:.3f} bits per weight  {row['path']}  {row['types']}")
    if args.out is not None:
        provenance.finish(prov, labels, args.out)
        provenance.write_artifact(args.out, {"kind": "bits_per_weight", "created_unix": time.time(), "rows": rows,
                                             "provenance": prov, "labels": labels})
        print(f"artifact: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
