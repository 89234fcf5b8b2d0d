"""`cli.py compare` and `cli.py ablate`: `run` over a grid, on one loaded target, in one run folder.

The grid is methods (or variants of one method) x benchmarks x prompts x temperatures. Each
temperature is one `Runner` (AR inside its per-prompt rotation); `harness.runs.runner.execute_grid`
runs them all on one target with one set of drafters, in one run folder (records merge by key,
so the grid resumes like `run`) under one progress view. Tables and plots are then rebuilt from
the records alone, exactly as `cli.py table DIR` / `cli.py plot DIR` do.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.runs.benchmarks import load_questions, resolve_data_dir
from harness.runs.results import default_run_dir
from harness.runs.runner import RunConfig, Runner, execute_grid
from harness.runs.settings import check_settings, method_overrides, parse_tree_budget
from harness.runs.slots import load_target
from methods.registry import method_info

DEFAULT_METHOD = "pld"


@dataclass
class GridSpec:
    """What `compare` / `ablate` were asked for; its hash names the default run folder."""

    methods: list[str] | None          # None: pld + every trained method whose weights are found
    benchmarks: list[str]
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    target: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None      # see RunConfig
    compile: bool = False              # see RunConfig
    limit: int | None = 10
    ids: list[int] | None = None
    max_new_tokens: int = 128
    top_p: float = 1.0
    acceptance: str | None = None      # the rule at T > 0 (T = 0 is always greedy); default lossless
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    system_prompt: str | None = None
    prompt_files: dict[str, dict[str, str]] = field(default_factory=dict)   # see RunConfig
    typical: list[str] = field(default_factory=list)   # methods that also run Medusa's typical rule at T > 0

    def __post_init__(self) -> None:
        if not self.temperatures:
            self.temperatures = [0.0]
        self.temperatures = sorted({float(t) for t in self.temperatures})
        if not self.benchmarks:
            raise SpecbenchError("--benchmarks is empty")

    def run_config(self, temperature: float, methods: list[str]) -> RunConfig:
        return RunConfig(
            methods=methods, benchmarks=self.benchmarks, target=self.target, dtype=self.dtype, device=self.device,
            device_map=self.device_map, compile=self.compile, limit=self.limit, ids=self.ids, max_new_tokens=self.max_new_tokens,
            temperature=temperature,
            top_p=self.top_p, acceptance=None if temperature == 0 else self.acceptance, seed=self.seed,
            settings=self.settings, chat_template=self.chat_template, system_prompt=self.system_prompt,
            prompt_files=self.prompt_files)

    def request(self) -> dict[str, Any]:
        """The spec as meta.json stores it; the newer fields only when set, so older run folders
        keep their config hash and resume."""
        out = asdict(self)
        for key in ("prompt_files", "typical", "device_map", "compile"):
            if not out[key]:
                del out[key]
        return out


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

def run_grid(spec: GridSpec, out: Path | None = None, data_dir: str | Path | None = None,
             console: Console | None = None, target=None, *, command: str = "compare",
             variants: dict[str, dict[str, Any]] | None = None, ablation: dict[str, Any] | None = None,
             train_steps: int = 0, ray: bool = False, ray_address: str | None = None, pack: bool = False) -> Path:
    """Run the grid into one run folder and return its path (resumes finished cells): one
    `Runner` per temperature through `execute_grid`, the path `cli.py run` takes too.

    User errors (benchmarks, options, settings, unknown methods) are raised before the target loads.
    `ray`: the cells run as Ray tasks (harness/runs/distributed.py); `pack` lets untimed CPU cells
    share a node, one CPU each.
    """
    from methods.registry import get_method

    console = console or Console(stderr=True)
    data_dir = resolve_data_dir(data_dir) if any(b not in spec.prompt_files for b in spec.benchmarks) else None
    request = {"command": command, **spec.request()}
    if ablation:
        request["ablation"] = {k: ablation[k] for k in ("method", "sweep", "fixed", "grid")}
    out = Path(out) if out else default_run_dir(request)
    probe_methods = spec.methods or [DEFAULT_METHOD]
    for t in spec.temperatures:
        spec.run_config(t, probe_methods)  # rule / temperature / limits: one line, before loading
    files = spec.run_config(spec.temperatures[0], probe_methods).files()
    for b in spec.benchmarks:
        load_questions(b, data_dir, spec.limit, spec.ids, files)
    if spec.methods is not None:
        check_settings(spec.settings, {m: get_method(m) for m in spec.methods if m != "ar"})
    if spec.typical:
        if not any(t > 0 for t in spec.temperatures):
            raise SpecbenchError("--typical runs Medusa's typical rule, which needs a --temperature > 0")
        stray = [m for m in spec.typical if spec.methods is not None and m not in spec.methods]
        if stray:
            raise SpecbenchError(f"--typical {','.join(stray)}: not among --methods ({','.join(spec.methods or [])})")
    if ray:
        from harness.runs.distributed import ray_module

        ray_module()  # not installed: one line, before anything loads
    elif pack:
        raise SpecbenchError("--pack packs Ray cells on a node; it needs --ray")
    # On Ray the workers load the target; the driver needs one only to find methods or check variants.
    if target is None and (not ray or spec.methods is None or variants):
        target = load_target(spec.run_config(spec.temperatures[0], probe_methods), console)
    methods = spec.methods
    if methods is None:
        methods = discover_methods(target, spec.settings, console)
        console.print(f"methods: {', '.join(methods)}")
    if variants:
        check_arch_variants(get_method(methods[0]), variants, target, train_steps, console)

    runners = [Runner(spec.run_config(t, methods), out, data_dir, console, target=target, variants=variants)
               for t in spec.temperatures]
    # --typical M: those methods again under Medusa's typical rule (lossy, labelled so) at each T > 0.
    typical = [m for m in methods if m in spec.typical]
    for t in (t for t in spec.temperatures if t > 0 and typical):
        cfg = spec.run_config(t, typical)
        cfg.acceptance = "typical"
        cfg.sampling()
        runners.append(Runner(cfg, out, data_dir, console, target=target, variants=variants))
    config = {**request, "methods": methods}
    if ablation:
        config["ablation"] = ablation
    if ray:
        from harness.runs.distributed import execute_grid_on_ray

        return execute_grid_on_ray(runners, config, ray_address, pack, console)
    return execute_grid(runners, config)


def run_ablation(method: str, pairs: list[str], grid: bool, spec: GridSpec, out: Path | None = None,
                 data_dir: str | Path | None = None, console: Console | None = None, target=None,
                 train_steps: int = 0, tree_budget: int | str | None = None, **ray: Any) -> Path:
    """`cli.py ablate`: the variants of `method` beside AR, on the grid of `spec` (`ray`: run_grid's
    ray, ray_address, pack); `tree_budget` fixes the tree's size for every variant (--set wins)."""
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
    spec.methods = [method]
    spec.settings = {}
    return run_grid(spec, out, data_dir, console, target, command="ablate", variants=variants, ablation=ablation,
                    train_steps=train_steps, **ray)
