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
    f.write_text("import os\nfrom omni_patches import apply_all\ndef f():\n    import omni_quant.kernels.w4a8\n")
    assert [n for _, n in _imports(f)] == ["os", "omni_patches", "omni_quant"]


HARNESS = SRC.parent / "harness"
# harness subpackage (or root module) -> the harness parts it may import; "root" is the package itself
# (REPO, RESULTS_DIR) and harness/provenance.py, which every artifact writer shares.
HARNESS_ALLOWED = {
    "root": {"root"},
    "models": {"root", "models"},                       # the real models, the engine recipe, fidelity
    "memory": {"root", "models", "memory"},             # tree memory, the ledger, the step profile
    "kernels": {"root", "models", "memory", "kernels"},  # kernel matrix, page bench
    "arms": {"root", "models", "memory", "arms", "workloads"},  # one runner per engine or peer
    "workloads": {"root", "workloads"},                 # speculation workloads: prompts from installed sources
    "load": {"root", "models", "memory", "arms", "workloads", "load"},  # servers under load: client, sweep, soak
    "grid": {"root", "grid"},                           # passes, judge, metrics, guard: arms run as commands
    "paired": {"root", "models", "grid", "load", "workloads", "paired"},  # servers taking turns, paired ratios
    "artifacts": {"root", "grid", "artifacts"},         # results, plots, docs tables: re-judged from the grid
    "demo": {"root", "models", "arms"},
    "startup": {"root", "models", "arms", "startup"},  # start-up profiles: the server arm's client, the recipe
    "__main__": set(),                                  # dispatches by module name (importlib), imports none
}


def _harness_part(path: Path) -> str:
    rel = path.relative_to(HARNESS)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return {"demo.py": "demo", "__main__.py": "__main__"}.get(rel.name, "root")


def _harness_targets(path: Path) -> list[tuple[int, str]]:
    """(line, harness part) for every import of the harness in ``path``."""
    subpackages = {p.name for p in HARNESS.iterdir() if (p / "__init__.py").exists()}
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "harness" else [f"harness.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "harness":
                out.append((node.lineno, parts[1] if len(parts) > 1 and parts[1] in subpackages else "root"))
    return out


def _harness_modules() -> list[Path]:
    """The harness's own modules: not what runs leave under harness/results (compile caches hold .py files)."""
    return sorted(p for p in HARNESS.rglob("*.py") if not p.is_relative_to(HARNESS / "results"))


def test_harness_parts_import_only_lower_parts():
    modules = _harness_modules()
    parts = {_harness_part(p) for p in modules}
    assert parts == set(HARNESS_ALLOWED), f"harness parts {sorted(parts)} not all in the table (docs/architecture.md)"
    bad = [f"{p.relative_to(HARNESS.parent)}:{line} imports harness part {target!r}"
           for p in modules for line, target in _harness_targets(p)
           if target not in HARNESS_ALLOWED[_harness_part(p)]]
    assert not bad, "harness layering broken (docs/architecture.md):\n" + "\n".join(bad)


def test_the_harness_checker_sees_an_upward_import(tmp_path):
    """The rule is not vacuous: a grid module importing an arm runner is caught."""
    f = tmp_path / "m.py"
    f.write_text("from harness.arms import vllm\nfrom harness import RESULTS_DIR, grid\n")
    assert _harness_targets(f) == [(1, "arms"), (2, "root"), (2, "grid")]
    assert _harness_part(HARNESS / "grid" / "m.py") == "grid" and "arms" not in HARNESS_ALLOWED["grid"]


QUANT = SRC / "omni_quant" / "omni_quant"
# omni-quant's parts (docs/architecture.md) -> the parts each may import; "root" is the package's own modules
# (settings, the extension entry). The runtime never imports the converter; the format and the kernels import
# nothing else of omni-quant.
QUANT_ALLOWED = {
    "root": {"root", "format", "kernels", "runtime", "conversion"},
    "format": {"format"},
    "kernels": {"kernels"},
    "runtime": {"root", "format", "kernels", "runtime"},
    "conversion": {"root", "format", "conversion"},
}


def _quant_module(path: Path) -> str:
    parts = list(path.relative_to(QUANT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _quant_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in QUANT_ALLOWED) else "root"


def _quant_graph() -> dict[str, set[str]]:
    """omni-quant module -> the omni-quant modules it imports, anywhere in its body (functions included)."""
    modules = {_quant_module(p): p for p in QUANT.rglob("*.py") if "build" not in p.parts}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("omni_quant"):
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            deps |= {t for t in targets if t in modules and t not in (name, "omni_quant")}
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, found = {}, []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_omni_quant_parts_import_only_what_the_map_allows():
    graph = _quant_graph()
    assert {_quant_part(m) for m in graph} == set(QUANT_ALLOWED), sorted(graph)
    bad = [f"{m} imports {d}" for m, deps in sorted(graph.items()) for d in sorted(deps)
           if _quant_part(d) not in QUANT_ALLOWED[_quant_part(m)]]
    assert not bad, "omni-quant layering broken (docs/architecture.md):\n" + "\n".join(bad)


def test_omni_quant_has_no_import_cycle():
    """Imports inside functions count: a cycle held together by a late import is still a cycle."""
    assert _cycles(_quant_graph()) == []


def test_the_quant_checkers_see_a_runtime_import_of_the_converter_and_a_cycle():
    """The rules are not vacuous: an arrow from the runtime to the converter, and a two-module cycle, are caught."""
    assert "conversion" not in QUANT_ALLOWED["runtime"]
    assert _quant_part("omni_quant.runtime.config") == "runtime" and _quant_part("omni_quant.settings") == "root"
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]
