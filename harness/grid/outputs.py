"""Equal greedy outputs across arms, asserted in the artifact (issue 33: speculation must not change them).

A spec may hold ``"same_outputs": [{"reference": TAG, "arms": [TAG, ...]}, ...]``. Arms that report
``provenance.outputs`` (``{prompt id: [generated token ids]}``, as ``run-spec`` and ``run-llama-server``
do) are compared, pass by pass, with the reference arm's first good pass; the reference's own later
passes are compared too (greedy decoding of one engine must repeat itself).
"""

from __future__ import annotations

from typing import Any

__all__ = ["compare_outputs", "OUTPUTS_DIFFER"]

OUTPUTS_DIFFER = "GREEDY OUTPUTS DIFFER"


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter length if one is a prefix of the
    other and the lengths differ), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(runs: list[dict[str, Any]], groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Check every group of ``same_outputs`` over the passes ``runs`` (``PassResult.to_dict()``s).

    Returns ``{"equal": bool, "groups": [{"reference", "reference_pass", "compared": [...],
    "differ": [{"arm", "pass", "prompt", "first_difference"}], "missing": [...]}]}``: ``compared`` lists
    ``"arm pass N"`` for every good pass checked; ``missing`` names good passes (or a reference) that
    reported no outputs, which makes ``equal`` False: a comparison that could not be made is not a pass.
    """
    out = {"equal": True, "groups": []}
    good = [r for r in runs if r.get("ok")]
    for group in groups:
        ref_tag = group["reference"]
        entry: dict[str, Any] = {"reference": ref_tag, "reference_pass": None, "compared": [], "differ": [],
                                 "missing": []}
        ref_runs = [r for r in good if r["tag"] == ref_tag and (r.get("arm_provenance") or {}).get("outputs")]
        if not ref_runs:
            entry["missing"].append(f"{ref_tag}: no good pass reported outputs")
            out["equal"] = False
            out["groups"].append(entry)
            continue
        ref = ref_runs[0]
        entry["reference_pass"] = ref["pass_index"] + 1
        want: dict[str, list[int]] = ref["arm_provenance"]["outputs"]
        for tag in [ref_tag, *group["arms"]]:
            for r in (r for r in good if r["tag"] == tag and r is not ref):
                got = (r.get("arm_provenance") or {}).get("outputs")
                if not got:
                    entry["missing"].append(f"{tag} pass {r['pass_index'] + 1}: no outputs")
                    continue
                entry["compared"].append(f"{tag} pass {r['pass_index'] + 1}")
                for prompt in sorted(set(want) | set(got)):
                    if prompt not in want or prompt not in got:
                        entry["differ"].append({"arm": tag, "pass": r["pass_index"] + 1, "prompt": prompt,
                                                "first_difference": None})
                        continue
                    at = _first_difference(want[prompt], got[prompt])
                    if at is not None:
                        entry["differ"].append({"arm": tag, "pass": r["pass_index"] + 1, "prompt": prompt,
                                                "first_difference": at})
        if entry["differ"] or entry["missing"]:
            out["equal"] = False
        out["groups"].append(entry)
    return out
