"""omni's measurement harness (not shipped): the real models, the arms, the grid and judge, artifacts.

Subpackages, one job each (docs/architecture.md has the map and who may import whom):
``models`` (the real models and fidelity), ``arms`` (one runner per engine or peer),
``grid`` (passes, judge, metrics, guard), ``artifacts`` (provenance, results, plots, docs tables),
``kernels`` (kernel matrix, page bench, bits per weight), ``memory`` (process-tree memory,
ledger, step profile); ``demo`` is the product's main job. ``python -m harness COMMAND``
dispatches (``harness/__main__.py``).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""The repository root (the harness runs from a checkout, never installed)."""

RESULTS_DIR = REPO / "harness" / "results"
"""Where every artifact is written and read."""
