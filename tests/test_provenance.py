"""Every artifact writer stamps the same provenance, and a headline artifact refuses a dirty tree.

The writers run for real on small inputs (``harness bpw`` and ``harness bench`` on the bundled
SmolLM2 GGUF or a synthetic arm, ``harness kernels`` on one tiny shape); the dirty-tree rule runs in
a throwaway git copy of the harness, so that this checkout's own state does not decide the test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import provenance
from harness.models.registry import gguf_path

REPO = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def _full(prov: dict) -> None:
    assert not provenance.missing_keys(prov, provenance.KEYS), provenance.missing_keys(prov, provenance.KEYS)
    assert prov["git_sha"] and prov["cpu_flags"] == provenance.collect_cpu([])["cpu_flags"]
    assert isinstance(prov["changed_files"], list) and prov["git_dirty"] is bool(prov["changed_files"])
    assert "cpu_speed_probe_end_s" in prov


@pytest.fixture(scope="module")
def gguf() -> Path:
    return gguf_path("smollm2-135m")


def test_bpw_artifact_carries_the_provenance_and_the_checkpoint_digest(tmp_path, gguf):
    out = tmp_path / "bpw.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "bpw", str(gguf), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    art = json.loads(out.read_text())
    _full(art["provenance"])
    size, sha = provenance.checkpoint_fingerprint(gguf)
    assert art["provenance"]["checkpoints"] == {str(gguf): {"bytes": size, "sha256": sha}}


def test_kernel_matrix_artifact_carries_the_provenance(tmp_path):
    out = tmp_path / "km.json"
    from harness.kernels import matrix

    shapes = {"tiny": [("down_proj", 64, 256, 32)]}
    old = dict(matrix.SHAPES)
    matrix.SHAPES.clear()
    matrix.SHAPES.update(shapes)
    try:
        assert matrix.main(["--models", "tiny", "--rows", "1", "--repeats", "1", "--copy-budget-mib", "1",
                            "--out", str(out)]) == 0
    finally:
        matrix.SHAPES.clear()
        matrix.SHAPES.update(old)
    art = json.loads(out.read_text())
    _full(art["provenance"])
    from omni_quant.kernels import w4a8 as native

    assert art["provenance"]["kernel_revision"] == native.KERNEL_REVISION and art["results"]


def _harness_copy(root: Path) -> Path:
    shutil.copytree(REPO / "harness", root / "harness", ignore=shutil.ignore_patterns("results", "__pycache__"))
    (root / "harness" / "results").mkdir()
    subprocess.run([*GIT, "-C", str(root), "init", "-q"], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "x"], check=True)
    return root


def test_a_headline_artifact_refuses_a_dirty_tree_unless_allowed(tmp_path, gguf):
    repo = _harness_copy(tmp_path / "repo")
    headline = repo / "harness" / "results" / "bpw-x.json"
    bpw = [sys.executable, "-m", "harness", "bpw", str(gguf), "--out"]

    clean = subprocess.run([*bpw, str(headline)], capture_output=True, text=True, cwd=repo, timeout=300)
    assert clean.returncode == 0, clean.stderr  # a clean tree: written, no dirty label
    art = json.loads(headline.read_text())
    assert art["provenance"]["changed_files"] == [] and not [lb for lb in art["labels"] if "DIRTY" in lb]
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "artifact"], check=True)

    (repo / "harness" / "grid" / "judge.py").write_text("# edited\n", encoding="utf-8")
    again = repo / "harness" / "results" / "bpw-y.json"
    refused = subprocess.run([*bpw, str(again)], capture_output=True, text=True, cwd=repo, timeout=300)
    assert refused.returncode == 2 and not again.exists()
    assert "refusing to measure" in refused.stderr and "harness/grid/judge.py" in refused.stderr
    assert "--allow-dirty" in refused.stderr and "Traceback" not in refused.stderr

    allowed = subprocess.run([*bpw, str(again), "--allow-dirty"], capture_output=True, text=True, cwd=repo,
                             timeout=300)
    assert allowed.returncode == 0, allowed.stderr
    art = json.loads(again.read_text())
    assert art["provenance"]["changed_files"] == ["harness/grid/judge.py"]
    assert [lb for lb in art["labels"] if lb.startswith("DIRTY TREE") and "harness/grid/judge.py" in lb]

    elsewhere = tmp_path / "scratch.json"  # not a headline artifact: written, labelled
    scratch = subprocess.run([*bpw, str(elsewhere)], capture_output=True, text=True, cwd=repo, timeout=300)
    assert scratch.returncode == 0, scratch.stderr
    assert any(lb.startswith("DIRTY TREE") for lb in json.loads(elsewhere.read_text())["labels"])


def test_write_artifact_refuses_an_artifact_without_provenance(tmp_path):
    with pytest.raises(ValueError, match="lacks provenance keys"):
        provenance.write_artifact(tmp_path / "x.json", {"kind": "x", "labels": [], "provenance": {"git_sha": "a"}})
    assert not (tmp_path / "x.json").exists()


def test_an_earlier_artifact_in_results_does_not_make_the_tree_dirty(tmp_path, gguf):
    """make bench-user writes a fidelity artifact, then a bench into harness/results/: artifacts are
    outputs of runs, not code, so the second headline artifact is measured on a clean tree."""
    repo = _harness_copy(tmp_path / "repo")
    bpw = [sys.executable, "-m", "harness", "bpw", str(gguf), "--out"]
    for name in ("first.json", "second.json"):
        proc = subprocess.run([*bpw, str(repo / "harness" / "results" / name)], capture_output=True, text=True,
                              cwd=repo, timeout=300)
        assert proc.returncode == 0, proc.stderr
    art = json.loads((repo / "harness" / "results" / "second.json").read_text())
    assert art["provenance"]["changed_files"] == [] and art["provenance"]["git_dirty"] is False
