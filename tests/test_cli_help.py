"""Every command's --help describes every option and argument in one line, and prints it whole; run,
compare and ablate accept the same shared options (the known differences listed)."""
from __future__ import annotations

import re

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


def unprinted(typer_app, args: list[str], cmd) -> list[str]:
    """Options of `cmd` whose whole help text (whitespace and the panel's box lines aside) is not in
    `args --help`'s output."""
    out = CliRunner().invoke(typer_app, [*args, "--help"], env={"COLUMNS": "200"}).output
    shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", out).split())
    return [p.opts[0] for p in cmd.params if is_option(p) and p.help and " ".join(p.help.split()) not in shown]


@pytest.mark.parametrize("name", ["compare", "bench", "train"])
def test_help_prints_the_descriptions(name):
    assert unprinted(app, name.split(), dict(COMMANDS)[name]) == []


def test_the_check_catches_a_help_not_printed():
    """The whole help is looked for: a hidden option's help starting with a printed word is caught."""
    probe = typer.Typer()

    @probe.command()
    def one(shown: int = typer.Option(1, help="printed in full, however long the line runs"),
            hidden: int = typer.Option(2, help="printed nowhere: hidden", hidden=True)) -> None:
        """A probe."""

    @probe.command()
    def two() -> None:
        """A second command, so the probe's commands are named."""

    assert unprinted(probe, ["one"], typer.main.get_command(probe).commands["one"]) == ["--hidden"]


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


GRID_COMMANDS = ("run", "compare", "ablate")
# Options that belong to some of the three by their nature: ablate sweeps one method (an argument,
# not --methods) over --grid and may train a variant (--train-steps); compare records its cells in
# the history.
OWN = {"--methods": {"run", "compare"}, "--grid": {"ablate"}, "--train-steps": {"ablate"},
       "--record": {"compare"}, "--history": {"compare"}, "--allow-dirty": {"compare"}}
# Known drift: options that apply to a command which lacks them today. Remove an entry when the
# command takes the option; an option added to one command only fails the test until the others
# take it too (or it is listed here, or in OWN, with the reason).
LACKS = {"run": {"--preset", "--typical", "--ray", "--ray-address", "--pack", "--ci"},
         "compare": {"--ids", "--checkpoint"},
         "ablate": {"--top-p", "--device-map", "--chat-template", "--system-prompt", "--ids", "--checkpoint",
                    "--typical"}}


def option_names(cmd) -> set[str]:
    return {p.opts[0] for p in cmd.params if is_option(p)}


def missing_options(names: dict[str, set[str]]) -> dict[str, set[str]]:
    """{command: the options of the others it lacks, OWN aside}."""
    every = set().union(*names.values())
    return {c: {o for o in every - names[c] if o not in OWN} for c in GRID_COMMANDS}


def test_run_compare_and_ablate_accept_the_same_shared_options():
    """Every option of one of the three is an option of the others, but for OWN and LACKS."""
    names = {c: option_names(dict(COMMANDS)[c]) for c in GRID_COMMANDS}
    assert {o: {c for c in GRID_COMMANDS if o in names[c]} for o in OWN} == OWN
    assert missing_options(names) == LACKS


def test_an_option_added_to_one_command_is_drift():
    names = {c: option_names(dict(COMMANDS)[c]) for c in GRID_COMMANDS}
    names["compare"].add("--new-knob")
    drift = missing_options(names)
    assert drift["run"] - LACKS["run"] == drift["ablate"] - LACKS["ablate"] == {"--new-knob"}
