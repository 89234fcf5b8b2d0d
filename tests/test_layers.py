"""The architecture's rules, checked on the source: every import points down a layer, method files
build only on the shared parts below them, everything above the methods reaches a method only
through the registry, and no module imports another module's private names.

The layers, bottom to top (the design's rules, written once, here):
  harness.core            target, cache, tree, verification, decoding loop, hardware; knows no drafter
  methods.common          what drafters share: the Drafter interface, draft vocab, checkpoint I/O,
                          the heads' tree walk, blocks, the losses a drafter computes, EAGLE's draft head
  methods                 the drafters (one file each) and the registry
  harness.train           distillation, features, trainer, tree fitting
  harness.runs            benchmarks, runner, run folders, statistics, compare, regress, bench
  harness.peers           the official implementations beside ours (drafter export, base model
                          views, the peer runner); on the level of harness.runs
  harness.testing         test doubles the tests and scripts share (oracle and random drafters,
                          official checkpoint layouts); on the level of harness.runs
  harness.report          tables and plots
  cli, scripts            the command line and the hand-run scripts (may import anything below)
A module may import its own layer and any layer below it; lazy imports inside functions count.
No code imports a module of tests/ (a test module is no library: shared test doubles are harness.testing).
Two more rules hold what "a method is one file" means:
  - a method file (methods/<name>.py, and a plugin's module under examples/) imports from this
    repository only harness.core and methods.common: never another method file, the registry,
    or harness.train / runs / report;
  - above the methods, a method is reached only through methods.registry (methods.common is
    shared code, open to all): no `from methods.pld import ...` in the harness, cli or scripts.
And no import circle anywhere, inside a layer too (a module-level or a lazy import inside a
function: either closes the circle once both have run). Importing a module of harness.report loads
neither torch nor a method: tables and plots read methods' display names from a static table.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# (layer, module prefix); a module belongs to the layer with the longest prefix it matches, so
# methods.common is not counted with the methods above it. cli and scripts share the top rank;
# harness.peers and harness.testing share the rank of harness.runs.
LAYERS = [
    ("core", "harness.core"),
    ("common", "methods.common"),
    ("methods", "methods"),
    ("train", "harness.train"),
    ("runs", "harness.runs"),
    ("peers", "harness.peers"),
    ("testing", "harness.testing"),
    ("report", "harness.report"),
    ("cli", "cli"),
    ("scripts", "scripts"),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
RANK["scripts"] = RANK["cli"]
RANK["peers"] = RANK["runs"]
RANK["testing"] = RANK["runs"]
# Where the code is: top-level files and folders checked (examples/ holds plugin packages).
SOURCES = ("cli.py", "harness", "methods", "scripts", "examples")
HEAVY = ("torch", "methods")   # what a report module may not import (packages and their modules)


def layer_of(module: str) -> str | None:
    for name, prefix in sorted(LAYERS, key=lambda lp: -len(lp[1])):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return None


def module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, names) for every import in the file, nested ones included."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def is_method_file(root: Path, file: Path, module: str) -> bool:
    """A drafter's own file: methods/<name>.py (not the registry, not methods.common) or a module of
    a plugin package under examples/."""
    if file.relative_to(root).parts[0] == "examples":
        return True
    return layer_of(module) == "methods" and module not in ("methods", "methods.registry")


def source_files(root: Path) -> list[Path]:
    out = []
    for part in SOURCES:
        path = root / part
        out += [path] if path.is_file() else sorted(path.rglob("*.py")) if path.is_dir() else []
    return out


def violations(root: Path) -> list[str]:
    """Every upward import, every import a method file or a layer above the methods may not make,
    and every import of another module's private name under `root`."""
    found = []
    for file in source_files(root):
        me = module_name(root, file)
        mine = layer_of(me)
        method_file = is_method_file(root, file, me)
        where = f"{file.relative_to(root)}"
        for line, target, names in imports(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            # `from methods.common import losses` imports the module methods.common.losses (its own layer)
            modules = [f"{target}.{n}" for n in names if is_module(root, f"{target}.{n}")]
            targets = modules or [target]
            for t in targets:
                theirs = layer_of(t)
                if mine and theirs and RANK[theirs] > RANK[mine]:
                    found.append(f"{where}:{line}: {me} ({mine}) imports {t} ({theirs}), a layer above")
                elif method_file and theirs and theirs not in ("core", "common"):
                    found.append(f"{where}:{line}: method file {me} imports {t}: a method builds only on "
                                 "harness.core and methods.common")
                elif not method_file and theirs == "methods" and RANK[mine or "cli"] > RANK["methods"] \
                        and t != "methods.registry":
                    found.append(f"{where}:{line}: {me} imports {t}: above the methods, reach a method "
                                 "through methods.registry")
            if target.split(".")[0] == "tests":
                found.append(f"{where}:{line}: {me} imports the test module {target}: code imports no test; "
                             "what tests and code share lives in harness/testing")
            if mine == "report" and target.split(".")[0] in HEAVY:
                found.append(f"{where}:{line}: report module {me} imports {target}: reports load no torch and "
                             "no method (display names: harness/runs/method_display.py)")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != me and layer_of(target):
                found.append(f"{where}:{line}: {me} imports private {', '.join(private)} from {target}")
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the modules of this repository it imports}, lazy imports included. `from a import b`
    points at the module a.b where there is one, else at a (whose name b is)."""
    graph = {}
    for file in source_files(root):
        me = module_name(root, file)
        package = me if file.name == "__init__.py" else me.rpartition(".")[0]
        edges = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if is_module(root, a.name)}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up `level - 1` packages
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                subs = {f"{base}.{a.name}" for a in node.names if is_module(root, f"{base}.{a.name}")}
                edges |= subs or ({base} if is_module(root, base) else set())
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of `graph`: each strongly connected component of two or more modules (or one
    importing itself), sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_cycle_anywhere():
    assert import_cycles(import_graph(REPO)) == []


@pytest.mark.parametrize("file,line,circle", [
    ("harness/core/tiny_target.py", "from harness.core.target import Target", ["harness.core.target", "harness.core.tiny_target"]),
    ("harness/runs/executor.py", "from harness.runs.distributed import RayBackend",
     ["harness.runs.distributed", "harness.runs.executor"]),
    ("harness/runs/slots.py", "from harness.runs import executor", ["harness.runs.executor", "harness.runs.slots"]),
    ("methods/common/checkpoint_io.py", "from methods.common import base", ["methods.common.base", "methods.common.checkpoint_io"]),
    ("cli.py", "import cli", ["cli"]),
])
def test_an_added_circle_is_caught(tmp_path, file, line, circle):
    """The check is not vacuous: one lazy import added to a copy of the sources closes a circle."""
    for f in source_files(REPO):
        dest = tmp_path / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    bad = tmp_path / file
    bad.write_text(bad.read_text(encoding="utf-8") + "\n\ndef _added():\n" + "    " + line + "\n")
    found = import_cycles(import_graph(tmp_path))
    assert any(set(circle) <= set(c) for c in found), found


def heavy_imports(module: str) -> list[str]:
    """The HEAVY modules loaded by importing `module` in a fresh interpreter."""
    probe = (f"import sys, {module}\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


REPORT_MODULES = sorted(module_name(REPO, f) for f in (REPO / "harness" / "report").glob("*.py")
                        if f.name != "__init__.py")


@pytest.mark.parametrize("module", REPORT_MODULES)
def test_a_report_module_imports_no_torch_and_no_method(module):
    assert heavy_imports(module) == []


def test_the_heavy_import_probe_sees_torch_and_the_methods():
    """Not vacuous: the executor (which runs drafters) loads both."""
    found = heavy_imports("harness.runs.executor")
    assert "torch" in found and "methods.registry" in found


def test_every_import_points_down_and_no_private_name_crosses_a_module():
    assert violations(REPO) == []


@pytest.mark.parametrize("file,line,needle", [
    ("harness/core/tree.py", "from harness.runs.results import RunDir", "harness.core.tree (core) imports harness.runs.results (runs)"),
    ("harness/core/decode.py", "from methods.registry import get_method", "harness.core.decode (core) imports methods.registry (methods)"),
    ("methods/pld.py", "    from harness.train import pipeline", "methods.pld (methods) imports harness.train.pipeline (train)"),
    ("harness/runs/regress.py", "from harness.report import tables", "harness.runs.regress (runs) imports harness.report"),
    ("methods/common/losses.py", "import methods.eagle", "methods.common.losses (common) imports methods.eagle (methods)"),
    ("methods/gumiho.py", "from methods.eagle import _private_helper", "imports private _private_helper from methods.eagle"),
    ("methods/eagle2.py", "from methods.eagle import EAGLE1_TREE", "method file methods.eagle2 imports methods.eagle"),
    ("methods/hydra.py", "from methods.registry import get_method", "method file methods.hydra imports methods.registry"),
    ("harness/runs/bench.py", "from methods.pld import PromptLookupDrafter",
     "harness.runs.bench imports methods.pld: above the methods, reach a method through methods.registry"),
    ("harness/report/tables.py", "from methods.registry import method_info",
     "report module harness.report.tables imports methods.registry"),
    ("harness/report/plots.py", "import torch", "report module harness.report.plots imports torch"),
    ("scripts/gpu_check.py", "from tests.conftest import make_tiny_target",
     "scripts.gpu_check imports the test module tests.conftest"),
    ("harness/runs/bench.py", "import tests.oracle", "harness.runs.bench imports the test module tests.oracle"),
    ("harness/testing/hub_layouts.py", "from harness.report import tables",
     "harness.testing.hub_layouts (testing) imports harness.report"),
    ("harness/peers/base_view.py", "from harness.report import tables",
     "harness.peers.base_view (peers) imports harness.report"),
    ("harness/peers/export.py", "from methods.medusa import Medusa",
     "harness.peers.export imports methods.medusa: above the methods, reach a method through methods.registry"),
    ("scripts/profile_drafting.py", "from methods.sps import SpeculativeSampling", "scripts.profile_drafting imports methods.sps"),
    ("scripts/held_out_tau.py", "from harness.train.data import _split", "imports private _split from harness.train.data"),
    ("examples/ngram_drafter/ngram_drafter/drafter.py", "from harness.runs.executor import Runner",
     "method file examples.ngram_drafter.ngram_drafter.drafter imports harness.runs.executor"),
])
def test_an_added_bad_import_is_caught(tmp_path, file, line, needle):
    """The check is not vacuous: a copy of the sources with one bad import added fails it."""
    for f in source_files(REPO):
        dest = tmp_path / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    before = set(violations(tmp_path))
    bad = tmp_path / file
    bad.write_text(bad.read_text(encoding="utf-8") + "\n\ndef _added():\n" + "    " + line.strip() + "\n")
    found = set(violations(tmp_path)) - before
    assert any(needle in v for v in found), found
