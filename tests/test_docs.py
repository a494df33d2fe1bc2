"""Every figure in README and docs is traceable: tables are generated from the artifacts they name
(``python -m harness results docs``) and must match them; every artifact named exists."""

import re
from pathlib import Path

from harness.artifacts.results import TABLE_BEGIN, render_docs

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_generated_tables_match_their_artifacts():
    stale = render_docs(DOCS, write=False)
    assert not stale, f"tables drifted from their artifacts in {stale}: run `python -m harness results docs`"
    assert TABLE_BEGIN in (REPO / "README.md").read_text(), "the README's results are generated tables"


def test_every_artifact_named_in_the_docs_exists():
    named = {m for f in DOCS for m in re.findall(r"[\w.-]+-\d{8}T\d{6}Z\.(?:json|png)", f.read_text())}
    assert named, "the docs name their artifacts"
    missing = sorted(n for n in named if not (REPO / "harness" / "results" / n).exists())
    assert not missing, f"named in README/docs but not in harness/results: {missing}"


def test_docs_do_not_point_outside_the_repository():
    for f in DOCS:
        assert "../shared" not in f.read_text(), f"{f} points outside the repository"


def test_a_fidelity_table_row_is_the_artifacts_own_numbers(tmp_path):
    import json

    import pytest

    from harness.artifacts.results import fidelity_table

    art = "harness/results/fidelity_smollm2-135m-q4-head8-20261201T165508Z.json"
    data = json.loads((REPO / art).read_text())
    (row,) = [ln for ln in fidelity_table([art]).splitlines() if art in ln]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[:5] == ["smollm2-135m-bf16", "q4-head8", f"{data['test_bits_per_weight']['bits_per_weight']:.2f}",
                         f"{data['result']['top1_agreement']:.3f}", f"{data['result']['mean_kl_top20']:.3f}"]
    bench = sorted((REPO / "harness" / "results").glob("decode_vs_llamacpp-*.json"))[0].relative_to(REPO)
    with pytest.raises(ValueError, match="not a fidelity or bits-per-weight one"):
        fidelity_table([str(bench)])


def test_prose_figures_carry_their_labels_and_exist_in_their_artifacts():
    from harness.artifacts.prose import check

    problems = check(DOCS, REPO)
    assert not problems, "figures in prose (run `python -m harness results docs` for the label tags):\n" + "\n".join(
        problems[:30])


def test_the_prose_rules_catch_each_breach(tmp_path):
    """Not vacuous: a figure the artifact does not hold, a missing label tag and a retracted artifact
    are each caught; the tag that ``results docs`` writes satisfies the label rule."""
    import json

    from harness.artifacts.prose import check, tag_mentions

    results = tmp_path / "harness" / "results"
    results.mkdir(parents=True)
    (results / "a.json").write_text(json.dumps({"labels": ["CPU SPEED CHANGED DURING RUN: x"],
                                                "provenance": {"git_sha": "abc", "git_dirty": False},
                                                "summary": {"tg_tps": [{"median": 28.664}]}}))
    (results / "old.json").write_text(json.dumps({"retracted": True, "provenance": {"git_sha": "abc"}, "v": 1.5}))
    doc = tmp_path / "d.md"
    doc.write_text("Decode `harness/results/a.json` ran at 28.66 and 31.20 tok/s.\n\n"
                   "Once `harness/results/old.json` said 1.5.\n")
    found = check([doc], tmp_path)
    assert any("a.json quoted with no tag, not its labels [CPU SPEED CHANGED DURING RUN]" in p for p in found)
    assert any("31.20 is in none of harness/results/a.json" in p for p in found)
    assert not any("28.66" in p for p in found)
    assert any("old.json is retracted" in p for p in found)
    (results / "plain.json").write_text(json.dumps({"provenance": {"git_sha": "abc", "git_dirty": False}, "v": 2.5}))
    other = tmp_path / "e.md"
    other.write_text("Run `harness/results/plain.json` [DIRTY TREE] ended at 2.75.\n\n"
                     "<!-- results-table: harness/results/old.json -->\n<!-- /results-table -->\n")
    found_other = check([other], tmp_path)
    assert any("plain.json quoted with [DIRTY TREE], not its labels []" in p for p in found_other)
    assert any("2.75 is in none" in p for p in found_other)  # a figure ending its sentence is checked too
    assert any("the table of harness/results/old.json quotes a retracted artifact" in p for p in found_other)
    doc.write_text(tag_mentions(doc.read_text(), tmp_path).replace(" and 31.20", ""))
    assert "`harness/results/a.json` [CPU SPEED CHANGED DURING RUN] ran" in doc.read_text()
    assert [p for p in check([doc], tmp_path) if "a.json" in p] == []


def test_hand_written_tables_are_held_to_their_sections_artifacts(tmp_path):
    """Tables: a bare artifact file name names it; a table naming none is held to its section's artifacts (sums of
    a start-up profile's adjacent phases included); a table in a section naming none is a breach unless a
    ``<!-- figures: why -->`` line precedes it; versions are not figures."""
    import json

    from harness.artifacts.prose import check

    results = tmp_path / "harness" / "results"
    results.mkdir(parents=True)
    (results / "s-20260101T000000Z.json").write_text(json.dumps({
        "provenance": {"git_sha": "abc"}, "phases": [{"seconds": 1.25}, {"seconds": 2.5}, {"seconds": 0.75}]}))
    doc = tmp_path / "d.md"
    doc.write_text("# A\n\nFrom `s-20260101T000000Z.json`:\n\n| phase | s |\n|---|---|\n| a+b | 3.75 |\n| c | 0.75 |\n"
                   "| wrong | 9.99 |\n\n# B\n\n| x | y |\n|---|---|\n| vLLM 0.28 | 4.5 |\n\n"
                   "<!-- figures: arithmetic -->\n\n| x | y |\n|---|---|\n| bits | 4.625 |\n")
    found = check([doc], tmp_path)
    assert [p.split(": ", 1)[1][:30] for p in found] == ["9.99 is in none of harness/res",
                                                       "4.5 in a table whose section n"], found
