"""``omni-patches status [--worker] [--json]``: each patch's state here and inside a real worker.

Per patch: target found, fingerprint matching, switched on, applied in this process and
(``--worker``) applied in the worker of a minimal engine (a tiny random Llama). Exit 1
when a switched-on patch is not applied (or cannot be); 2 when a switch's value is invalid.

stdout carries only the report: vLLM's own log goes to stderr (``VLLM_LOGGING_STREAM``,
unless you set it), so ``--json`` output can be parsed whole.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

__all__ = ["main"]


def _worker_applied() -> list[str]:
    from omni_platform.testing import tiny_engine_reports

    return tiny_engine_reports()[0]["extension_reports"].get("patches", {}).get("applied", [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="omni-patches", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status")
    st.add_argument("--worker", action="store_true")
    st.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # before vLLM is imported
    from omni_patches.apply import apply_all, status
    from omni_patches.guards import PatchRefused, installed_vllm_version

    error = None
    try:
        apply_all()
    except PatchRefused as e:
        error = str(e)
    except ValueError as e:  # an OMNI_PATCH_*_OFF value that is not a boolean: a usage error
        if args.json:
            print(json.dumps({"vllm": installed_vllm_version(), "error": str(e), "patches": None}))
        print(f"omni-patches: error: {e}", file=sys.stderr)
        return 2
    from omni_platform.info import omni_off_reason

    off = omni_off_reason()
    if off:  # this process applied them (the command imports omni-patches); vLLM would not
        print(f"omni-patches: note: {off}; the patches below are applied in this process only", file=sys.stderr)
    rows = [asdict(s) for s in status()]
    worker = _worker_applied() if args.worker and error is None else None
    for r in rows:
        r["applied_in_worker"] = None if worker is None else r["name"] in worker
    bad = error is not None or any(r["enabled"] and (not r["applied"] or r["applied_in_worker"] is False) for r in rows)
    if args.json:
        print(json.dumps({"vllm": installed_vllm_version(), "error": error, "omni_off_reason": off, "patches": rows}))
    else:
        print(f"vLLM {installed_vllm_version()}" + (f"  REFUSED: {error}" if error else ""))
        for r in rows:
            in_worker = "applied" if r["applied_in_worker"] else "NOT applied"
            w = "" if r["applied_in_worker"] is None else f"  worker: {in_worker}"
            print(f"  {r['name']:40s} found={r['targets_found']} fingerprint={r['fingerprints_match']} "
                  f"on={r['enabled']} applied={r['applied']}{w}" + (f"  ({r['detail']})" if r["detail"] else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
