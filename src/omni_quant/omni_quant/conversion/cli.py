"""``omni-quant convert SRC DST [--recipe NAME] [--group-size N] [--keep-bf16 NAME ...] [--format cpu_int4|gptq]``.

SRC is a Hugging Face checkpoint directory, or a llama.cpp ``.gguf`` file (converted directly:
:mod:`omni_quant.conversion.gguf_file`; its 4-bit tensors keep their codes, at group size 32).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

__all__ = ["main"]


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread: a conversion under way removes its partial output on the
    way out (``convert`` and ``convert_gguf`` discard it on any BaseException), as on Ctrl-C."""


def _on_sigterm(signum, frame):
    raise _Terminated


def _stopped(exc: BaseException, where: str = "") -> int:
    """The one line for Ctrl-C or SIGTERM (``where``: " at DST" once DST is known), and the exit code."""
    terminated = isinstance(exc, _Terminated)
    print(f"omni-quant: {'terminated (SIGTERM)' if terminated else 'interrupted'}; nothing written{where}",
          file=sys.stderr)
    return 143 if terminated else 130


def _is_gguf(src: str) -> bool:
    """Whether SRC names a GGUF file: a file starting with the GGUF magic, or a path that is not a
    directory ending in ``.gguf`` in any case (so that a missing file is reported as a GGUF file)."""
    path = Path(src)
    if path.is_dir():
        return False
    if path.is_file():
        try:
            with path.open("rb") as f:
                if f.read(4) == b"GGUF":
                    return True
        except OSError:
            pass
    return src.lower().endswith(".gguf")


def main(argv: list[str] | None = None) -> int:
    """Command line; exit 2 with a clear message on bad input (nothing written), 130 on Ctrl-C.

    Ctrl-C at any point, the seconds spent importing torch included, ends with one line, not a
    traceback; a conversion under way removes its partial output first
    (:func:`omni_quant.conversion.checkpoint.convert`).
    SIGTERM (``kill``, a container stopping) does the same and exits 143 (128 + 15).
    """
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    except (KeyboardInterrupt, _Terminated) as e:
        return _stopped(e)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    from omni_quant.conversion.checkpoint import DEFAULT_GROUP_SIZE, convert
    from omni_quant.conversion.output import ConversionError
    from omni_quant.conversion.recipes import DEFAULT_RECIPE, RECIPES

    ap = argparse.ArgumentParser(prog="omni-quant", description="cpu_int4 tools for vLLM on CPU")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a bf16 Hugging Face checkpoint or a GGUF file to cpu_int4")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--recipe", default=DEFAULT_RECIPE, choices=tuple(RECIPES),
                   help="; ".join(f"{r.name}: {r.summary}" for r in RECIPES.values()) + f" (default {DEFAULT_RECIPE})")
    c.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE,
                   help=f"preferred group size: 128, 64 or 32 (default {DEFAULT_GROUP_SIZE})")
    c.add_argument("--keep-bf16", nargs="*", default=[], metavar="NAME",
                   help="modules to leave in bf16, e.g. lm_head, down_proj, or embed_tokens (the input embedding; "
                        "the only one a GGUF file takes)")
    c.add_argument("--format", default="cpu_int4", choices=("cpu_int4", "gptq"),
                   help="cpu_int4 (default), or gptq: stock vLLM's symmetric GPTQ format, round to nearest "
                        "(a baseline to compare with; the head stays bf16)")
    k = sub.add_parser("cache", help="the GGUF conversions `omni-vllm serve FILE.gguf` keeps: list or prune them")
    k.add_argument("action", choices=("list", "prune"))
    k.add_argument("--days", type=float, default=None, help="prune: also remove conversions unused for this many days")
    k.add_argument("--dry-run", action="store_true", help="prune: say what would be removed, remove nothing")
    args = ap.parse_args(argv)
    if args.cmd == "cache":
        return _cache(args)

    try:
        if _is_gguf(args.src):
            from omni_quant.conversion.embedding import KEEP_NAMES

            others = [k for k in args.keep_bf16 if k not in KEEP_NAMES]
            if (others or args.format != "cpu_int4" or args.group_size != DEFAULT_GROUP_SIZE
                    or args.recipe != DEFAULT_RECIPE):
                raise ConversionError("a GGUF file converts at group size 32 to cpu_int4 (its 4-bit blocks); "
                                      "--recipe, --group-size, --format and --keep-bf16 (but --keep-bf16 "
                                      f"{' '.join(KEEP_NAMES)}) apply to checkpoint directories")
            from omni_quant.conversion.gguf_file import convert_gguf

            reports = convert_gguf(args.src, args.dst, keep_embedding=bool(args.keep_bf16))
        else:
            reports = convert(args.src, args.dst, args.group_size, args.keep_bf16, args.format, args.recipe)
    except ConversionError as e:
        print(f"omni-quant: error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as e:
        return _stopped(e, f" at {args.dst}")
    q = [r for r in reports if r.bits is not None]
    dbs = [r.sqnr_db for r in q if r.sqnr_db is not None]
    emb = next((r.action for r in q if r.action.startswith("embedding")), "kept in bf16")
    print(f"quantized {len(q)} tensors (of them repacked without requantization: "
          f"{sum('repacked' in r.action for r in q)}; min SQNR {min(dbs, default=float('nan')):.1f} dB; "
          f"input embedding: {emb.removeprefix('embedding ')}), "
          f"copied {len(reports) - len(q)}; report: {args.dst}/quantization_report.json")
    print(args.dst)
    return 0


def _cache(args) -> int:
    """``omni-quant cache list|prune``: one line per conversion (MiB, last use, state); prune removes older
    converter versions, incomplete and damaged conversions and, with ``--days``, unused ones."""
    from omni_quant.conversion.gguf_cache import cache_root, entries, prune

    root = cache_root()
    if args.action == "list":
        rows = entries(root)
        for e in rows:
            state = (("current" if e.current else "older converter") + ("" if e.complete else ", incomplete")
                     + (f", damaged: {e.damaged}" if e.damaged else ""))
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            print(f"{e.bytes / 2**20:10.1f} MiB  {used}  {state:28s}  {e.path}")
        print(f"{len(rows)} conversion(s), {sum(e.bytes for e in rows) / 2**20:.1f} MiB in {root}")
        return 0
    gone = prune(root, args.days, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for e in gone:
        print(f"{verb} {e.path} ({e.bytes / 2**20:.1f} MiB{'; damaged: ' + e.damaged if e.damaged else ''})")
    print(f"{verb} {len(gone)} conversion(s), {sum(e.bytes for e in gone) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
