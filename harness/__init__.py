"""omni's measurement harness (not shipped): the real models, the arms, the grid and judge, artifacts.

Subpackages, one job each (docs/architecture.md has the map and who may import whom):
``models`` (the real models, the engine recipe, bits per weight, fidelity), ``arms`` (one runner
per engine or peer, and the one start-up definition), ``grid`` (passes, judge, metrics, guard),
``artifacts`` (results, plots, docs tables, the prose rules), ``kernels`` (kernel matrix, page
bench), ``memory`` (process-tree memory, ledger, step profile); at the root, ``provenance`` (what
every artifact carries) and ``demo`` (the product's main job). ``python -m harness COMMAND``
dispatches (``harness/__main__.py``).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The repository root (the harness runs from a checkout, never installed)."""

RESULTS_DIR = REPO / "harness" / "results"
"""Where every artifact is written and read."""
