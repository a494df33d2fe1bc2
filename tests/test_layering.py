"""The layering of docs/architecture.md, read from every shipped module's imports (ast: no import
runs, no vLLM needed). A shipped distribution imports a sibling only through the registry
(``omni.extensions`` entry points), never by name, and none imports the harness or the tests."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
# distribution package -> the omni packages it may import (besides itself)
ALLOWED = {
    "omni_platform": set(),                  # stable: names no extension
    "omni_quant": {"omni_platform"},         # an extension: the platform's registry and settings
    "omni_patches": {"omni_platform"},
}
OMNI = {"omni_platform", "omni_quant", "omni_patches", "harness", "tests", "conftest"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def _modules(pkg: str) -> list[Path]:
    return sorted((SRC / pkg / pkg).rglob("*.py"))


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_no_shipped_module_imports_a_sibling_by_name(pkg):
    assert _modules(pkg), f"no modules found for {pkg}"
    bad = [f"{path.relative_to(SRC)}:{line} imports {name}"
           for path in _modules(pkg) for line, name in _imports(path)
           if name in OMNI and name != pkg and name not in ALLOWED[pkg]]
    assert not bad, "layering broken (docs/architecture.md):\n" + "\n".join(bad)


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The rule is not vacuous: a module importing omni_patches from omni_platform is caught."""
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom omni_patches import apply_all\ndef f():\n    import omni_quant.native\n")
    assert [n for _, n in _imports(f)] == ["os", "omni_patches", "omni_quant"]
