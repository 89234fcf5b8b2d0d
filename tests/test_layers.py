"""The architecture's rules, checked on the source: every import points down a layer, and no
module imports another module's private names.

The layers, bottom to top (the design's rules, written once, here):
  harness.core            target, cache, tree, verification, decoding loop, hardware; knows no drafter
  harness.train.losses    the training losses the drafters share
  methods                 the drafters
  harness.train           distillation, features, trainer, tree fitting
  harness.runs            benchmarks, runner, run folders, statistics, compare, regress, bench
  harness.report          tables and plots
  cli                     the command line (may import anything)
A module may import its own layer and any layer below it; lazy imports inside functions count.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# (layer, module prefix); a module belongs to the first layer whose prefix it matches, so the
# more specific harness.train.losses comes before harness.train.
LAYERS = [
    ("core", "harness.core"),
    ("losses", "harness.train.losses"),
    ("methods", "methods"),
    ("train", "harness.train"),
    ("runs", "harness.runs"),
    ("report", "harness.report"),
    ("cli", "cli"),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


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


def violations(root: Path) -> list[str]:
    """Every upward import and every import of another module's private name under `root`."""
    files = [root / "cli.py"] + sorted((root / "harness").rglob("*.py")) + sorted((root / "methods").rglob("*.py"))
    found = []
    for file in files:
        if not file.exists():
            continue
        me = module_name(root, file)
        mine = layer_of(me)
        for line, target, names in imports(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            # `from harness.train import losses` imports the module harness.train.losses (its own layer)
            modules = [f"{target}.{n}" for n in names if is_module(root, f"{target}.{n}")]
            targets = modules or [target]
            for t in targets:
                theirs = layer_of(t)
                if mine and theirs and RANK[theirs] > RANK[mine]:
                    found.append(f"{file.relative_to(root)}:{line}: {me} ({mine}) imports {t} ({theirs}), a layer above")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and target != me and layer_of(target):
                found.append(f"{file.relative_to(root)}:{line}: {me} imports private {', '.join(private)} from {target}")
    return found


def test_every_import_points_down_and_no_private_name_crosses_a_module():
    assert violations(REPO) == []


@pytest.mark.parametrize("file,line,needle", [
    ("harness/core/tree.py", "from harness.runs.results import RunDir", "harness.core.tree (core) imports harness.runs.results (runs)"),
    ("methods/pld.py", "    from harness.train import pipeline", "methods.pld (methods) imports harness.train.pipeline (train)"),
    ("harness/runs/regress.py", "from harness.report import tables", "harness.runs.regress (runs) imports harness.report"),
    ("harness/train/losses.py", "import methods.base", "harness.train.losses (losses) imports methods.base (methods)"),
    ("methods/gumiho.py", "from methods.eagle import _private_helper", "imports private _private_helper from methods.eagle"),
])
def test_an_added_upward_import_is_caught(tmp_path, file, line, needle):
    """The check is not vacuous: a copy of the sources with one bad import added fails it."""
    for part in ("cli.py", "harness", "methods"):
        src = REPO / part
        if src.is_dir():
            for f in src.rglob("*.py"):
                dest = tmp_path / f.relative_to(REPO)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            (tmp_path / part).write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    bad = tmp_path / file
    bad.write_text(bad.read_text(encoding="utf-8") + "\n\ndef _added():\n" + "    " + line.strip() + "\n")
    found = violations(tmp_path)
    assert any(needle in v for v in found), found
