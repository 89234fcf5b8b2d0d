"""What a grid compares: the methods `compare` was not given (`discover_methods`), and the variants
of one method `ablate` sweeps (`ablation_grid`).

A grid is methods (or variants of one method) x benchmarks x prompts x temperatures: `run` is a
grid of one temperature, `compare` of several, `ablate` of one method's variants. The executor
(harness/runs/executor.py:run_grid) checks it against the machine, answers it by one backend into
one run folder (records merge by key, so every grid resumes), with the methods found here and the
variants' weights checked here (`check_arch_variants`). Tables and plots are then rebuilt from the records alone, exactly as
`cli.py table DIR` / `cli.py plot DIR` do.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.runs.config import RunConfig
from harness.runs.settings import method_overrides, parse_tree_budget
from methods.registry import method_info

DEFAULT_METHOD = "pld"


# ----------------------------------------------------------------------------- methods

def discover_methods(target, settings: dict[str, Any], console: Console) -> list[str]:
    """pld plus every registered method with `trainable = True` whose `create()` succeeds on
    `target` (its weights are found). A method that cannot be imported or built is skipped with
    one line saying why; it never stops the comparison of the others."""
    from methods.registry import get_method, method_names

    found = []
    for name in method_names():
        if name == DEFAULT_METHOD:
            continue
        try:
            cls = get_method(name)
        except Exception as e:  # noqa: BLE001 - a broken method module must not stop the others
            console.print(f"[yellow]skipping {name}:[/] cannot import it ({type(e).__name__}: {e})")
            continue
        if not getattr(cls, "trainable", False):
            continue
        try:
            cls.create(target, method_overrides(cls, settings, []))
        except SpecbenchError as e:
            console.print(f"[dim]not compared: {name} ({str(e).splitlines()[0][:160]})[/]")
            continue
        except Exception as e:  # noqa: BLE001 - a bug in one method is reported, the grid goes on
            console.print(f"[yellow]skipping {name}:[/] building it failed ({type(e).__name__}: {e})")
            continue
        found.append(name)
    # In the order the methods declare (papers' order); ties by name.
    return [DEFAULT_METHOD, *sorted(found, key=lambda m: (method_info(m).order, m))]


# ----------------------------------------------------------------------------- ablation variants

def fmt_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def parse_values(raw: str) -> list[Any]:
    """`5,10` -> [5, 10]; `true,false`; `off,paper,exact` (strings); `[1,2],[3,4]` (JSON lists)."""
    try:
        values = json.loads(f"[{raw}]")
    except json.JSONDecodeError:
        values = []
        for part in raw.split(","):
            part = part.strip()
            try:
                values.append(json.loads(part))
            except json.JSONDecodeError:
                values.append(part)
    if not values or any(v == "" for v in values):
        raise SpecbenchError(f"--set expects key=v1,v2,..., got an empty value in '{raw}'")
    return values


def parse_sweep(pairs: list[str], cls: type) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """`--set key=v1,v2` (swept) and `--set key=v` (fixed for every variant) for method `cls`."""
    fixed: dict[str, Any] = {}
    sweep: dict[str, list[Any]] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SpecbenchError(f"--set expects key=v1,v2,..., got '{pair}'")
        key, raw = (s.strip() for s in pair.split("=", 1))
        if key.startswith(f"{cls.name}."):
            key = key[len(cls.name) + 1:]
        if key in fixed or key in sweep:
            raise SpecbenchError(f"--set {key} is given twice; list its values once: {key}=v1,v2")
        values = list(dict.fromkeys(json.dumps(v, sort_keys=True) for v in parse_values(raw)))
        values = [json.loads(v) for v in values]
        for v in values:
            cls.resolve_config({key: v})  # unknown key: one line with did-you-mean
        if len(values) == 1:
            fixed[key] = values[0]
        else:
            sweep[key] = values
    if not sweep:
        raise SpecbenchError(f"nothing to sweep: give at least one --set key=v1,v2 (keys of {cls.name}: "
                             f"{', '.join(sorted(cls.defaults))})")
    return fixed, sweep


def make_variants(cls: type, fixed: dict[str, Any], sweep: dict[str, list[Any]],
                  grid: bool = False) -> dict[str, dict[str, Any]]:
    """{label: overrides}: the base (defaults + fixed) and, one factor at a time, each other
    swept value (or, with `grid`, every combination). Variants equal to an earlier one are dropped."""
    candidates: list[tuple[str, dict[str, Any]]] = []
    if grid:
        keys = list(sweep)
        for combo in itertools.product(*(sweep[k] for k in keys)):
            changes = dict(zip(keys, combo))
            label = ", ".join(f"{k}={fmt_value(v)}" for k, v in changes.items())
            candidates.append((label, {**fixed, **changes}))
    else:
        candidates.append(("default" if not fixed else "base", dict(fixed)))
        for key, values in sweep.items():
            for v in values:
                candidates.append((f"{key}={fmt_value(v)}", {**fixed, key: v}))
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for label, overrides in candidates:
        ident = json.dumps(cls.resolve_config(overrides), sort_keys=True, default=str)
        if ident in seen:
            continue
        seen.add(ident)
        out[label] = overrides
    if len(out) < 2:
        raise SpecbenchError("every swept value equals the default: nothing to compare")
    return out


def check_arch_variants(cls: type, variants: dict[str, dict[str, Any]], target, train_steps: int = 0,
                        console: Console | None = None) -> None:
    """A variant that changes an architecture key needs weights trained for that architecture
    (checkpoints are keyed by the arch hash). With `train_steps` > 0 the missing ones are trained
    first with that budget on the shared distilled data (reruns find and reuse them); otherwise
    fail before running anything."""
    for label, overrides in variants.items():
        config = cls.resolve_config(overrides)
        changed = [k for k in cls.arch_keys if config[k] != cls.defaults[k]]
        if not changed:
            continue
        try:
            cls.create(target, overrides)
            continue
        except SpecbenchError as e:
            if train_steps > 0 and not cls.weights_from:
                from harness.train.pipeline import train_method

                train_method(target, cls.name, {k: config[k] for k in changed}, steps=train_steps, console=console)
                continue
            sets = " ".join(f"--set {k}={fmt_value(config[k])}" for k in changed)
            raise SpecbenchError(
                f"variant '{label}' changes architecture key(s) {', '.join(changed)} of {cls.name}: it needs "
                f"weights trained for arch hash {cls.arch_hash(config)}; train them first with "
                f"`python cli.py train --method {cls.name} --target {target.name} {sets}` ({str(e).splitlines()[0]})"
            ) from None


# ----------------------------------------------------------------------------- an ablation's grid

def ablation_grid(method: str, pairs: list[str], grid: bool, cfg: RunConfig,
                  tree_budget: int | str | None = None) -> tuple[RunConfig, dict[str, dict[str, Any]], dict[str, Any]]:
    """`cli.py ablate`: the variants of `method` (swept by `pairs`, `--set key=v1,v2`; `grid`: every
    combination) to run beside AR on the benchmarks and temperatures of `cfg` (its methods and
    settings become the ablation's); `tree_budget` fixes the tree's size for every variant (--set
    wins). Returns what `harness/runs/executor.py:run_grid` takes: the config, `variants` and
    `ablation` (what meta.json stores of the sweep)."""
    from methods.registry import get_method

    cls = get_method(method)
    fixed, sweep = parse_sweep(pairs, cls)
    if tree_budget is not None:
        fixed = {**cls.budget_overrides(parse_tree_budget(tree_budget)), **fixed}
    variants = make_variants(cls, fixed, sweep, grid)
    base = cls.resolve_config(fixed)
    ablation = {
        "method": method, "sweep": sweep, "fixed": fixed, "grid": grid, "base_config": base,
        "variants": {label: {k: v for k, v in cls.resolve_config(o).items() if base.get(k) != v}
                     for label, o in variants.items()},
    }
    return replace(cfg, methods=[method], settings={}), variants, ablation
