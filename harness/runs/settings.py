"""`--set key=value` and `--tree-budget`: a run's method settings, parsed, checked against the
run's methods, and split into each method's own overrides."""
from __future__ import annotations

import json
from typing import Any

from harness.core.errors import SpecbenchError

# `--tree-budget N|auto`, kept in the run's settings under this key: each tree method turns it into
# its own keys (Drafter.budget_overrides), so one switch sizes every tree alike.
TREE_BUDGET = "tree_budget"


def parse_settings(pairs: list[str], tree_budget: str | None = None) -> dict[str, Any]:
    """`--set key=value` (repeatable): values parsed as JSON, else kept as strings. `tree_budget`
    (--tree-budget) rides in the settings (recorded in meta.json), parsed alike."""
    out: dict[str, Any] = {}
    for pair in [*pairs, *([f"{TREE_BUDGET}={tree_budget}"] if tree_budget is not None else [])]:
        if "=" not in pair:
            raise SpecbenchError(f"--set expects key=value, got '{pair}'")
        key, raw = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def parse_tree_budget(raw: Any) -> int | str:
    """"auto" or a positive number of draft tokens per verify; anything else is one clear error."""
    if raw == "auto":
        return "auto"
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(raw).strip() not in (str(value), f"{value}.0"):
        raise SpecbenchError(f"--tree-budget {raw!r}: give a number of draft tokens per verify (e.g. 24) or auto")
    return value


def method_overrides(method_cls: type, settings: dict[str, Any], all_methods: list[str]) -> dict[str, Any]:
    """The --set entries that apply to one method: `method.key=v` for it, plain `key=v` where it has the key."""
    mine: dict[str, Any] = {}
    if TREE_BUDGET in settings:  # --tree-budget first: explicit --set keys win over it
        mine.update(method_cls.budget_overrides(settings[TREE_BUDGET]))
    for key, value in settings.items():
        if key == TREE_BUDGET:
            continue
        if "." in key:
            name, sub = key.split(".", 1)
            if name == method_cls.name:
                mine[sub] = value
        elif key in method_cls.defaults:
            mine[key] = value
    return mine


def check_settings(settings: dict[str, Any], classes: dict[str, type]) -> None:
    """Every --set key must be used by at least one method of the run, and each method must take
    the values it is given (its --set entries and --tree-budget together: `Drafter.resolve_config`
    checks their types, ranges and fit), so that a bad value fails before any model loads."""
    for key in settings:
        if key == TREE_BUDGET:
            parse_tree_budget(settings[key])
            continue
        if "." in key:
            name, sub = key.split(".", 1)
            # a method given as module:Class is addressed by its declared `name`
            owners = [c for n, c in classes.items() if name in (n, c.name)]
            if not owners:
                raise SpecbenchError(f"--set {key}: method '{name}' is not in this run ({', '.join(classes)})")
            for c in owners:
                c.resolve_config({sub: settings[key]})
        elif not any(key in c.defaults for c in classes.values()):
            if len(classes) == 1:
                next(iter(classes.values())).resolve_config({key: settings[key]})  # raises with did-you-mean
            raise SpecbenchError(f"--set {key}: no method of this run ({', '.join(classes)}) has that key")
    for cls in classes.values():
        cls.resolve_config(method_overrides(cls, settings, list(classes)))
