"""`cli.py run`, `compare` and `ablate`: one path (`run_grid`) from a checked RunConfig to a run folder.

A grid is methods (or variants of one method) x benchmarks x prompts x temperatures: `run` is a
grid of one temperature, `compare` of several, `ablate` of one method's variants (`run_ablation`).
`run_grid` checks the config against the machine once, finds the methods `compare` was not given
(`discover_methods`) and hands the grid to the executor (harness/runs/executor.py), which answers
it by one backend into one run folder (records merge by key, so every grid resumes). Tables and
plots are then rebuilt from the records alone, exactly as `cli.py table DIR` / `cli.py plot DIR` do.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.core.target import Target, check_target_spec
from harness.runs.benchmarks import load_questions, resolve_data_dir
from harness.runs.config import RunConfig
from harness.runs.executor import Backend, Grid, LocalBackend, execute
from harness.runs.results import RunDir, default_run_dir
from harness.runs.settings import check_settings, method_overrides, parse_tree_budget
from harness.runs.slots import load_target, method_classes
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


# ----------------------------------------------------------------------------- the grid

def run_grid(cfg: RunConfig, out: Path | None = None, data_dir: str | Path | None = None,
             console: Console | None = None, target: Target | None = None, *, command: str = "run",
             variants: dict[str, dict[str, Any]] | None = None, ablation: dict[str, Any] | None = None,
             train_steps: int = 0, ray: bool = False, ray_address: str | None = None, pack: bool = False) -> Path:
    """The one path of `cli.py run`, `compare` and `ablate` (`command`, which meta.json stores):
    check `cfg` against this machine once (data, questions, methods, settings, checkpoint), load
    the target where the driver needs it (to find the methods, check variants, or answer), build
    the `Grid` and run it by a backend into one run folder; returns the folder (resumes finished
    answers). User errors are raised before the target loads.

    `target`: an already loaded one (tests); `variants`/`ablation`: `run_ablation`'s; `ray`: the
    answers as Ray tasks (harness/runs/distributed.py), `pack` letting untimed CPU cells share a
    node, one CPU each.
    """
    console = console or Console(stderr=True)
    backend: Backend = LocalBackend()
    if ray:
        from harness.runs.distributed import RayBackend

        backend = RayBackend(ray_address, pack)  # Ray not installed: one line, before anything loads
    elif pack:
        raise SpecbenchError("--pack packs Ray cells on a node; it needs --ray")
    request = cfg.to_dict(command)
    if ablation:
        request["ablation"] = {k: ablation[k] for k in ("method", "sweep", "fixed", "grid")}
    out = Path(out) if out else default_run_dir(request)
    # Built-in benchmarks are read from the data folder; a run of prompt files alone needs none.
    data_dir = resolve_data_dir(data_dir) if any(b not in cfg.prompt_files for b in cfg.benchmarks) else None
    questions = {b: load_questions(b, data_dir, cfg.limit, cfg.ids, cfg.files()) for b in cfg.benchmarks}
    if target is None:
        check_target_spec(cfg.target)
    classes = checked_classes(cfg) if cfg.methods is not None else {}
    # On Ray the workers load the target; the driver needs one only to find methods or check variants.
    if target is None and (not ray or cfg.methods is None or variants):
        target = load_target(cfg, console)
    if cfg.methods is None:
        found = discover_methods(target, cfg.settings, console)
        console.print(f"methods: {', '.join(found)}")
        cfg = replace(cfg, methods=found, typical=[m for m in cfg.typical if m in found])
        classes = checked_classes(cfg)
    if variants:
        check_arch_variants(classes[cfg.methods[0]], variants, target, train_steps, console)
    stored = {**request, "methods": cfg.methods}
    if ablation:
        stored["ablation"] = ablation
    return execute(Grid(cfg, questions, classes, variants, RunDir(out), data_dir, stored, console, target), backend)


def checked_classes(cfg: RunConfig) -> dict[str, type]:
    """The Drafter classes of `cfg`'s methods, with its --set keys and --checkpoint checked against them."""
    classes = method_classes(cfg.methods)
    check_settings(cfg.settings, classes)
    if cfg.checkpoint and not any(c.trainable for c in classes.values()):
        raise SpecbenchError("--checkpoint given, but no method of this run loads weights")
    return classes


def run_ablation(method: str, pairs: list[str], grid: bool, cfg: RunConfig, out: Path | None = None,
                 data_dir: str | Path | None = None, console: Console | None = None, target: Target | None = None,
                 train_steps: int = 0, tree_budget: int | str | None = None, **ray: Any) -> Path:
    """`cli.py ablate`: the variants of `method` (swept by `pairs`, `--set key=v1,v2`) beside AR,
    on the benchmarks and temperatures of `cfg` (its methods and settings are the ablation's);
    `ray`: run_grid's ray, ray_address, pack; `tree_budget` fixes the tree's size for every
    variant (--set wins)."""
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
    return run_grid(replace(cfg, methods=[method], settings={}), out, data_dir, console, target, command="ablate",
                    variants=variants, ablation=ablation, train_steps=train_steps, **ray)
