"""docs/architecture.md stays true: every `file.py:name` it names is defined in that file, every
package folder under harness/ and methods/ is named, its layer diagram lists the layers in the
order tests/test_layers.py enforces, the path of one prompt is a path in the code (each step is
called by an earlier step's function), and its measured length is the length of that list."""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from tests.test_layers import LAYERS, RANK

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
# `harness/core/decode.py:generate`, `harness/runs/executor.py:Runner.answer`, `cli.py:compare`
REF = re.compile(r"`((?:[\w-]+/)*[\w-]+\.py):([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)?)`")
STEP = re.compile(r"^(\d+)\. `([^`]+)`", re.M)
MEASURED = re.compile(r"Measured: (\d+) calls in (\d+) files \(([^)]*)\); the bracketed calls\s+add (\d+) files")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def path_section(text: str) -> str:
    """The section on the path of one prompt, up to the next heading."""
    start = text.index("## One prompt")
    return text[start:text.index("\n## ", start + 1)]


def function_node(tree: ast.Module, name: str) -> ast.AST | None:
    """The definition of `name` (a top-level function or class, or `Class.method`) in the module."""
    head, _, member = name.partition(".")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == head:
            if not member:
                return node
            return next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.name == member), None)
    return None


def defines(tree: ast.Module, name: str) -> bool:
    """Whether the module defines `name` at top level (a function or class), or `Class.method`."""
    return function_node(tree, name) is not None


def missing_refs(text: str, root: Path) -> list[str]:
    """Every `file.py:name` of `text` whose file is not under `root` or does not define the name."""
    out = []
    for file, name in dict.fromkeys(REF.findall(text)):
        path = root / file
        if not path.is_file():
            out.append(f"{file}:{name}: no such file")
        elif not defines(ast.parse(path.read_text(encoding="utf-8")), name):
            out.append(f"{file}:{name}: {file} defines no {name}")
    return out


def called_names(root: Path, file: str, name: str) -> set[str]:
    """The names `file:name` calls: `f(...)` gives f, `x.f(...)` gives f."""
    node = function_node(ast.parse((root / file).read_text(encoding="utf-8")), name)
    calls = [n.func for n in ast.walk(node) if isinstance(n, ast.Call)] if node is not None else []
    return {f.id if isinstance(f, ast.Name) else f.attr for f in calls if isinstance(f, (ast.Name, ast.Attribute))}


def unreached_steps(text: str, root: Path) -> list[str]:
    """The numbered steps of the path that no earlier step's function calls (by the callee's name)."""
    steps = [s.split(":") for _, s in STEP.findall(path_section(text))]
    out = []
    for i, (file, name) in enumerate(steps[1:], start=2):
        callee = name.rpartition(".")[2]
        if not any(callee in called_names(root, f, n) for f, n in steps[:i - 1]):
            out.append(f"step {i} `{file}:{name}`: no earlier step calls {callee}")
    return out


def package_folders(root: Path) -> list[str]:
    return sorted(str(p.parent.relative_to(root)) for top in ("harness", "methods")
                  for p in (root / top).rglob("__init__.py"))


def test_every_named_function_exists():
    text = doc_text()
    assert len(REF.findall(text)) >= 30, "the doc names its functions as `file.py:name`"
    assert missing_refs(text, REPO) == []


def test_a_renamed_function_on_the_path_is_caught(tmp_path):
    """The check is not vacuous: rename a function and a method the path names, in a copy."""
    for file, _ in REF.findall(doc_text()):
        dest = tmp_path / file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / file, dest)
    assert missing_refs(doc_text(), tmp_path) == []
    for file, old, new in [("harness/core/decode.py", "def speculative_step(", "def one_step("),
                           ("harness/runs/executor.py", "    def answer(self, slot", "    def reply(self, slot")]:
        path = tmp_path / file
        source = path.read_text(encoding="utf-8")
        assert old in source
        path.write_text(source.replace(old, new), encoding="utf-8")
    assert missing_refs(doc_text(), tmp_path) == [
        "harness/runs/executor.py:Runner.answer: harness/runs/executor.py defines no Runner.answer",
        "harness/core/decode.py:speculative_step: harness/core/decode.py defines no speculative_step",
    ]


def test_every_package_folder_is_named():
    text = doc_text()
    folders = package_folders(REPO)
    assert {"harness/core", "harness/runs", "harness/report", "harness/train", "methods/common"} <= set(folders)
    assert [f for f in folders if f + "/" not in text] == []


def test_the_diagram_lists_the_layers_top_down():
    """The diagram's lines for the layers of tests/test_layers.py, read down, never go up a layer."""
    block = doc_text().split("```")[1].splitlines()
    found = []
    for name, prefix in LAYERS:
        label = prefix.replace(".", "/") + ("/" if name not in ("cli",) else ".py")
        lines = [i for i, line in enumerate(block) if line.startswith(label + " ")]
        assert lines, f"the diagram has no line for {label}"
        found.append((lines[0], RANK[name], label))
    ranks = [rank for _, rank, _ in sorted(found)]
    assert ranks == sorted(ranks, reverse=True), sorted(found)


def test_the_measured_path_is_the_numbered_list():
    section = path_section(doc_text())
    steps = STEP.findall(section)
    assert [int(n) for n, _ in steps] == list(range(1, len(steps) + 1))
    refs = [s for _, s in steps]
    assert all(REF.fullmatch(f"`{r}`") for r in refs), refs
    files = list(dict.fromkeys(r.split(":")[0] for r in refs))
    match = MEASURED.search(section)
    assert match, "the path section states 'Measured: N calls in M files (...); the bracketed calls add K files'"
    calls, n_files, names, extra = int(match[1]), int(match[2]), match[3], int(match[4])
    assert (calls, n_files) == (len(refs), len(files))
    assert [n.strip() for n in names.split(",")] == [Path(f).name for f in files]
    bracketed = {f for inner in re.findall(r"\[([^\]]*)\]", section) for f, _ in REF.findall(inner)}
    assert extra == len(bracketed - set(files))


def test_each_step_of_the_path_is_called_by_an_earlier_one():
    assert unreached_steps(doc_text(), REPO) == []


def test_a_step_no_longer_called_is_caught(tmp_path):
    """Not vacuous: in a copy where the report no longer calls write_tables, step 13 is unreached."""
    for file, _ in REF.findall(doc_text()):
        dest = tmp_path / file
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / file, dest)
    readme = tmp_path / "harness/report/run_readme.py"
    source = readme.read_text(encoding="utf-8")
    assert "write_tables(" in source
    readme.write_text(source.replace("write_tables(", "other_tables("), encoding="utf-8")
    assert unreached_steps(doc_text(), tmp_path) == [
        "step 13 `harness/report/tables.py:write_tables`: no earlier step calls write_tables"]


@pytest.mark.parametrize("text,needle", [
    ("`harness/core/decode.py:no_such_function`", "defines no no_such_function"),
    ("`harness/runs/executor.py:Runner.no_such_method`", "defines no Runner.no_such_method"),
    ("`harness/core/no_such_module.py:generate`", "no such file"),
])
def test_a_wrong_reference_is_reported(text, needle):
    assert any(needle in m for m in missing_refs(text, REPO))
