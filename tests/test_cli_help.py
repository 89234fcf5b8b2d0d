"""Every command's --help describes every option and argument in one line."""
from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from cli import app


def commands(group, prefix: str = "") -> list[tuple[str, object]]:
    """(name, click command) for every command of the app, sub-groups walked. (Typer ships its own
    click, so the walk goes by attributes, not by click's classes.)"""
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((prefix + name, cmd))
        if hasattr(cmd, "commands"):
            out += commands(cmd, f"{prefix}{name} ")
    return out


def is_option(param) -> bool:
    return param.param_type_name == "option"


def undocumented(cmd) -> list[str]:
    """Options and arguments of `cmd` whose help is empty, runs over one line, or gives only the
    default instead of saying what the value is."""
    bad = []
    for p in cmd.params:
        text = (getattr(p, "help", None) or "").strip()
        if not text or "\n" in text or text.lower().startswith("default"):
            bad.append(p.opts[0] if is_option(p) else p.name)
    return bad


ROOT = typer.main.get_command(app)
COMMANDS = commands(ROOT)


def test_the_walk_sees_every_command():
    names = {n for n, _ in COMMANDS}
    assert {"run", "compare", "ablate", "table", "plot", "bench", "distill", "train", "calibrate-tree",
            "fetch-data", "regress", "history"} <= names


@pytest.mark.parametrize("name,cmd", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_option_has_a_one_line_help(name, cmd):
    assert cmd.help and cmd.help.strip(), f"`{name}` has no description"
    assert undocumented(cmd) == [], f"`cli.py {name}`: options without a one-line help"


def test_the_check_catches_a_missing_help():
    probe = typer.Typer()

    @probe.command()
    def one(documented: int = typer.Option(1, help="has help"), bare: int = typer.Option(2),
            only_default: int = typer.Option(3, help="default: 3"), arg: str = typer.Argument("x")) -> None:
        """A probe."""

    assert undocumented(typer.main.get_command(probe)) == ["--bare", "--only-default", "arg"]


@pytest.mark.parametrize("name", ["compare", "bench", "train"])
def test_help_prints_the_descriptions(name):
    out = CliRunner().invoke(app, [*name.split(), "--help"], env={"COLUMNS": "200"}).output
    cmd = dict(COMMANDS)[name]
    for p in cmd.params:
        if is_option(p) and p.help:
            assert p.help.split()[0] in out, f"{p.opts[0]}'s help is not printed"


def test_run_compare_and_ablate_declare_their_shared_options_once():
    """An option the three share has one declaration: the same names and the same help in each
    (only --temperature differs: `run` takes one value, a grid several)."""
    cmds = {name: dict(COMMANDS)[name] for name in ("run", "compare", "ablate")}
    seen: dict[str, tuple] = {}
    for name, cmd in cmds.items():
        for p in cmd.params:
            if not is_option(p) or p.opts[0] == "--temperature":
                continue
            decl = (tuple(p.opts), tuple(p.secondary_opts), p.help)
            assert seen.setdefault(p.opts[0], decl) == decl, f"{name} declares {p.opts[0]} otherwise"
    assert {"--methods", "--benchmarks", "--set", "--limit", "--acceptance", "--out"} <= set(seen)
    assert all("-t" in p.opts for cmd in cmds.values() for p in cmd.params if p.name == "temperature")
