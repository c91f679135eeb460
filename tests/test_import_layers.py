"""Imports run one way: the drawing in docs/architecture.md ("Which way the imports run") orders the
packages bottom to top, and no module imports from a package drawn above its own, whether the
import sits at the top of the file or inside a function."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = REPO / "dsv4opt"
ENTRY_POINTS = {"__init__", "__main__"}  # dsv4opt/__init__.py, __main__.py: above everything


def drawn_order(doc: str) -> list[str]:
    """The packages of the drawing, bottom first (the leaves' row left to right)."""
    block = doc.split("## Which way the imports run", 1)[1]
    lines = re.search(r"\n\n((?:    \S.*\n)+)", block).group(1).splitlines()
    order: list[str] = []
    for line in lines:
        names = line.split("->")[0].split("(")[0]
        order += [n.strip() for n in names.split(",") if n.strip()]
    return order


def imported_units(path: Path) -> set[str]:
    """The top-level dsv4opt units (package or module under dsv4opt/) that `path` imports from."""
    package = path.relative_to(REPO).with_suffix("").parts[:-1]  # what a relative import starts from
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - (node.level - 1)])
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("dsv4opt.")}
    return out


def unit_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def back_up_imports(order: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(order)}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = unit_of(path)
        if unit in ENTRY_POINTS:
            continue
        if unit not in rank:
            wrong.append(f"{path.relative_to(REPO)}: {unit} is not in the drawing")
            continue
        for target in sorted(imported_units(path) - {unit}):
            if target not in rank:
                wrong.append(f"{path.relative_to(REPO)} imports {target}, which is not in the drawing")
            elif rank[target] > rank[unit]:
                wrong.append(f"{path.relative_to(REPO)} ({unit}) imports {target}, drawn above it")
    return wrong


def test_the_drawing_names_every_package_once_and_capture_below_analysis():
    order = drawn_order((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert len(order) == len(set(order))
    assert order.index("capture") < order.index("analysis") < order.index("decision") < order.index("loop") \
        < order.index("report") < order.index("cli")
    on_disk = {unit_of(p) for p in PACKAGE.rglob("*.py")} - ENTRY_POINTS
    assert on_disk == set(order)


def test_no_import_runs_back_up():
    order = drawn_order((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert back_up_imports(order) == []


def test_an_import_running_back_up_is_caught():
    # The same code against a drawing with loop moved below analysis: loop's imports of analysis
    # now run back up.
    order = drawn_order((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    flipped = [n for n in order if n != "loop"]
    flipped.insert(flipped.index("analysis"), "loop")
    wrong = back_up_imports(flipped)
    assert wrong and all("(loop) imports" in w for w in wrong)
    assert any("imports analysis, drawn above it" in w for w in wrong)


def test_no_import_circle_inside_capture():
    """capture/embedded.py runs one rank or the ranks; neither rank_run.py nor ranks.py imports it back."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "dsv4opt" / "capture"
    for name in ("rank_run.py", "ranks.py"):
        tree = ast.parse((root / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                     for a in n.names}
        assert not any(m.endswith("capture.embedded") for m in imported), name


def module_imports(package: Path) -> dict[str, set[str]]:
    """Each module of `package` (a folder of dsv4opt) -> the modules of the same package it imports,
    at the top of the file or inside a function ('from package import a, b' counts a and b)."""
    dotted = ".".join(package.relative_to(REPO).parts)
    names = {p.stem for p in package.glob("*.py")}
    graph = {}
    for path in package.glob("*.py"):
        out = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == dotted:
                out |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(dotted + "."):
                out.add(node.module[len(dotted) + 1:].split(".")[0])
            elif isinstance(node, ast.Import):
                out |= {a.name[len(dotted) + 1:].split(".")[0] for a in node.names if a.name.startswith(dotted + ".")}
        graph[path.stem] = out - {path.stem, "__init__"}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of `graph`, each found from its smallest name."""
    circles = []

    def walk(start, node, trail):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                circles.append(trail + [start])
            elif nxt > start and nxt not in trail:
                walk(start, nxt, trail + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return circles


def test_the_mma_attn_modules_import_in_no_circle():
    """mma-attn's modules import one way: dispatch.py decides, the kernel files import the shared
    Gluon pieces and never kernel.py back, and both benches take their inputs from bench_inputs.py."""
    graph = module_imports(PACKAGE / "optimizations" / "mma_attn")
    assert {"kernel", "dispatch", "gluon_blocks", "kernel_gluon_fp8_ws", "bench", "bench_peers"} <= set(graph)
    assert graph["kernel"] >= {"dispatch", "kernel_gluon_fp8_ws"}  # the walk sees imports inside functions
    circles = import_circles(graph)
    assert circles == [], circles


def test_an_import_circle_is_found():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=[str(p.relative_to(REPO)) for p in PACKAGES])
def test_no_package_imports_in_a_circle(package):
    """Inside every package of dsv4opt the modules (and subpackages) import one way."""
    circles = import_circles(module_imports(package))
    assert circles == [], circles


def private_imports() -> dict[str, set[str]]:
    """file -> the `_` names it imports from another module of dsv4opt."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names = {a.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsv4opt")
                 for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
        if names:
            out[str(path.relative_to(REPO))] = names
    return out


def test_no_private_name_is_imported_from_another_file():
    assert private_imports() == {}
