"""The static display table (harness/runs/method_display.py) says what each built-in class declares,
and a name outside it (a plugin's `module:Class`, an unknown name) is shown from its class."""
from __future__ import annotations

from dataclasses import asdict

from harness.runs.method_display import BUILTIN, MethodDisplay, method_display
from methods.common.base import Drafter
from methods.registry import method_info, method_names, method_source, spare_color


class Shown(Drafter):
    """A drafter outside the table, reached as `tests.test_method_display:Shown`."""

    name = "shown"
    display_name = "Shown here"
    paper = "nobody, 2026"
    color = "#123456"
    order = 99


def declared(name: str) -> dict:
    info = method_info(name)
    return asdict(MethodDisplay(name, info.display_name, info.paper, info.year, info.color, info.order))


def test_the_table_holds_ar_and_every_builtin_method():
    builtins = {n for n in method_names() if method_source(n) == "built-in"}
    assert set(BUILTIN) == {"ar", *builtins}


def test_the_table_says_what_each_class_declares():
    assert {n: asdict(d) for n, d in BUILTIN.items()} == {n: declared(n) for n in BUILTIN}


def test_a_name_outside_the_table_is_shown_from_its_class():
    path = "tests.test_method_display:Shown"
    assert method_display(path) == MethodDisplay(path, "Shown here", "nobody, 2026", None, "#123456", 99)
    assert method_display("no_such_method") == MethodDisplay("no_such_method", "no_such_method", "", None,
                                                             spare_color("no_such_method"), 100)
