"""A run folder's report, rebuilt from its records alone: `write_report` (what `cli.py compare`,
`ablate`, `table` and `plot` end with) computes the statistics once (the bootstrap included),
renders the tables and plots from them, byte for byte the same on every rebuild, and last writes
DIR/README.md: the command that made the folder (rebuilt from the stored config), the machine,
commit and date, what the folder holds, and links to its tables and plots. Regenerate the README
alone, without touching tables or plots, with `write_run_readme(DIR)`."""
from __future__ import annotations

import json
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from harness.core.files import write_atomic
from harness.core.rules import default_rule
from harness.report.plots import write_plots
from harness.report.statistics import compute_stats
from harness.report.tables import write_tables
from harness.runs.folder_lock import hold
from harness.runs.method_display import method_display
from harness.runs.settings import TREE_BUDGET
from harness.runs.run_data import RunData, display_label, fmt_temperature, load_run

README = "README.md"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The tables whose markdown the README shows, first found first: a grid's main table, an ablation's.
HEADLINE_TABLES = ("main.md", "ablation.md")


# ----------------------------------------------------------------------------- the command

def _value(v: Any) -> str:
    """A config value as `--set` parses it back: bare strings where JSON would not read them,
    JSON otherwise (numbers, booleans, lists, strings that look like JSON or hold a comma)."""
    if isinstance(v, str):
        try:
            json.loads(v)
        except json.JSONDecodeError:
            if "," not in v:
                return v
    return json.dumps(v, separators=(",", ":"))


def _shown_path(path: Path) -> str:
    """`path` relative to the checkout when inside it (commands run from there), else absolute."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _benchmarks(config: dict) -> str:
    """Benchmark names, prompt files as NAME=PATH (the form `--benchmark` takes)."""
    files = config.get("prompt_files") or {}
    return ",".join(f"{b}={files[b]['path']}" if b in files else b for b in config.get("benchmarks", []))


def _common(config: dict) -> list[str]:
    """Options `run`, `compare` and `ablate` share, those at their default left out."""
    args = ["--target", config.get("target", "smollm2-135m"), "--dtype", config.get("dtype", "auto")]
    for key, default in (("device", "auto"), ("device_map", None), ("top_p", 1.0), ("seed", 0),
                         ("chat_template", None), ("system_prompt", None)):
        if config.get(key, default) != default:
            args += [f"--{key.replace('_', '-')}", _value(config[key])]
    if config.get("compile"):
        args.append("--compile")
    return args


def _settings(settings: dict) -> list[str]:
    """`--tree-budget` and `--set key=value` of a run's settings."""
    args = []
    for key, v in settings.items():
        args += ["--tree-budget", _value(v)] if key == TREE_BUDGET else ["--set", f"{key}={_value(v)}"]
    return args


def _grid_size(config: dict) -> list[str]:
    """`--limit` / `--max-new-tokens` of a grid, as `--preset paper` when that is what they are."""
    limit, tokens = config.get("limit"), config.get("max_new_tokens", 128)
    if limit is None:
        return ["--preset", "paper"] + ([] if tokens == 512 else ["--max-new-tokens", str(tokens)])
    return ["--limit", str(limit), "--max-new-tokens", str(tokens)]


def command_line(config: dict, run_dir: Path) -> str:
    """The `python cli.py ...` command that makes (or resumes) this run folder, from meta.json's config:
    `command` compare or ablate; a config with a single `temperature` was made by `run`."""
    command = config.get("command") or "run"
    temps = [a for t in config.get("temperatures", []) for a in ("--temperature", fmt_temperature(t))]
    if command == "ablate":
        ablation = config.get("ablation") or {}
        sets = [f"{k}={','.join(_value(v) for v in vs)}" for k, vs in (ablation.get("sweep") or {}).items()]
        sets += [f"{k}={_value(v)}" for k, v in (ablation.get("fixed") or {}).items()]
        args = ["ablate", ablation.get("method", (config.get("methods") or ["?"])[0]),
                *[a for s in sets for a in ("--set", s)], *(["--grid"] if ablation.get("grid") else []),
                "--benchmarks", _benchmarks(config), *temps, *_common(config), *_grid_size(config)]
    elif command == "compare":
        args = ["compare", "--methods", ",".join(config.get("methods") or []), "--benchmarks", _benchmarks(config),
                *temps, *_common(config), *_grid_size(config), *_settings(config.get("settings") or {})]
        if config.get("acceptance"):
            args += ["--acceptance", config["acceptance"]]
        if config.get("typical"):
            args += ["--typical", ",".join(config["typical"])]
    else:
        t = float(config.get("temperature", 0.0))
        args = ["run", "--method", ",".join(config.get("methods") or []), "--benchmark", _benchmarks(config),
                "--temperature", fmt_temperature(t), *_common(config)]
        if config.get("acceptance") not in (None, default_rule(t)):
            args += ["--acceptance", config["acceptance"]]
        if config.get("limit") is not None:
            args += ["--limit", str(config["limit"])]
        if config.get("ids"):
            args += ["--ids", ",".join(map(str, config["ids"]))]
        args += ["--max-new-tokens", str(config.get("max_new_tokens", 128))]
        if config.get("checkpoint"):
            args += ["--checkpoint", config["checkpoint"]]
        args += _settings(config.get("settings") or {})
    return shlex.join(["python", "cli.py", *args, "--out", _shown_path(run_dir)])


# ----------------------------------------------------------------------------- the facts

def _machine(run: RunData) -> str:
    meta = run.meta
    machine = run.setting()[2]
    extra = [f"{meta['logical_cores']} logical cores" if meta.get("logical_cores") else "",
             f"{meta['memory_gib']} GiB" if meta.get("memory_gib") else ""]
    return ", ".join([machine, *[e for e in extra if e]])


def _software(meta: dict) -> str:
    packages = meta.get("packages") or {}
    parts = [f"Python {meta['python']}" if meta.get("python") else ""]
    parts += [f"{p} {packages[p]}" for p in ("torch", "transformers") if p in packages]
    if meta.get("target_runtime"):
        parts.append(f"target runtime {meta['target_runtime']}")
    return ", ".join(p for p in parts if p) or "not recorded"


def _commit(meta: dict) -> str:
    commit = meta.get("commit") or "not recorded"
    if meta.get("dirty"):
        return f"`{commit}`, **dirty**: made with uncommitted changes, so the commit alone does not reproduce it"
    return f"`{commit}` (clean tree)" if meta.get("commit") else commit


def _date(meta: dict) -> str:
    # runs[0] is the first start (stamped a second before collect_meta's `date`): resumes follow it
    runs = (meta.get("runs") or [])[1:]
    date = str(meta.get("date") or "not recorded")
    return date + (f"; resumed {len(runs)}x, last {runs[-1]}" if runs else "")


def _acceptance(run: RunData) -> str:
    """The rules per temperature, lossy ones marked."""
    by_t: dict[float, list[str]] = {}
    for row in run.rows:
        rule = f"{row.acceptance} (lossy)" if row.lossy else row.acceptance
        if rule not in by_t.setdefault(row.temperature, []):
            by_t[row.temperature].append(rule)
    return "; ".join(f"T={fmt_temperature(t)}: {', '.join(r)}" for t, r in sorted(by_t.items()))


def _answers(run: RunData) -> str:
    """Questions and answers per method on each benchmark (every turn is an answer), benchmarks
    alike grouped; a row short of the others (an unfinished run) is named."""
    per_row = Counter((row, r.benchmark) for row in run.rows for r in run.row_records(row))
    groups: dict[tuple[int, int], list[str]] = {}
    short = []
    for b in run.benchmarks:
        counts = [per_row[(row, b)] for row in run.rows]
        questions = len({r.question_id for r in run.records if r.benchmark == b})
        groups.setdefault((questions, max(counts, default=0)), []).append(b)
        short += [f"{row.label} on {b} ({per_row[(row, b)]})" for row in run.rows if per_row[(row, b)] < max(counts)]
    text = "; ".join(f"{', '.join(bs)}: {q} questions, {a} answers per table row" for (q, a), bs in groups.items())
    tokens = run.meta.get("config", {}).get("max_new_tokens")
    text += f"; up to {tokens} new tokens per answer" if tokens else ""
    return text + (f"; fewer answers: {', '.join(short)}" if short else "")


def _tree_budgets(config: dict) -> str:
    """The budget every tree method was given (--tree-budget), else each method's own budget keys."""
    settings = config.get("settings") or {}
    parts = []
    if TREE_BUDGET in settings:
        parts.append(f"--tree-budget {settings[TREE_BUDGET]} (every tree method)")
    for label, entry in (config.get("methods_resolved") or {}).items():
        cfg = (entry.get("config") or {}) if isinstance(entry, dict) else {}
        if "total_tokens" in cfg:
            budget = f"total_tokens={cfg['total_tokens']}"
        elif isinstance(cfg.get("tree"), list):
            budget = f"fixed {len(cfg['tree'])}-node tree"
        elif "tree" in cfg:
            budget = f"tree={cfg['tree']}"
        else:
            continue
        parts.append(budget if label == budget else f"{label} {budget}")  # an ablation variant may be named by it
    return "; ".join(parts)


def _weights(config: dict) -> str:
    resolved = config.get("methods_resolved") or {}
    return ", ".join(f"{label} `{e['checkpoint_hash']}`" for label, e in resolved.items()
                     if isinstance(e, dict) and e.get("checkpoint_hash"))


def _ablation(ablation: dict | None) -> str:
    if not ablation:
        return ""
    sweep = "; ".join(f"{k} over {', '.join(map(str, vs))}" for k, vs in (ablation.get("sweep") or {}).items())
    fixed = ", ".join(f"{k}={v}" for k, v in (ablation.get("fixed") or {}).items())
    how = "every combination" if ablation.get("grid") else "one factor at a time around the defaults"
    return (f"{ablation.get('method', '?')}: {sweep} ({how})" + (f"; fixed {fixed}" if fixed else "")
            + f"; variants: {', '.join(ablation.get('variants') or {})}")


def _links(run_dir: Path) -> list[str]:
    lines = []
    for folder, pattern in (("tables", "*.md"), ("plots", "*.png")):
        for p in sorted((run_dir / folder).glob(pattern)):
            lines.append(f"- [{folder}/{p.name}]({folder}/{p.name})")
    others = [n for n in ("summary.csv", "records.jsonl", "meta.json") if (run_dir / n).exists()]
    lines.append("- " + ", ".join(f"[{n}]({n})" for n in others))
    return lines


def readme_text(run: RunData) -> str:
    """The README of `run`'s folder (a pure function of the folder's files, so a rebuild is identical)."""
    run_dir, meta = run.path, run.meta
    config = meta.get("config") or {}
    target, dtype, _ = run.setting()
    methods = list(dict.fromkeys(display_label(r.method) for r in run.rows))
    facts = [
        ("Target", f"{target} ({dtype})"),
        ("Methods", ", ".join(methods) + f" (beside {method_display('ar').display_name}, the baseline)"),
        ("Ablation", _ablation(run.ablation)),
        ("Benchmarks", ", ".join(run.benchmarks)),
        ("Temperatures", ", ".join(fmt_temperature(t) for t in run.temperatures)),
        ("Acceptance", _acceptance(run)),
        ("Answers", _answers(run)),
        ("Tree budgets", _tree_budgets(config)),
        ("Drafter weights", _weights(config)),
    ]
    provenance = [("Commit", _commit(meta)), ("Date", _date(meta)), ("Machine", _machine(run)),
                  ("Software", _software(meta))]
    lines = [f"# {run_dir.name}", "",
             "Generated from meta.json and records.jsonl by `python cli.py table DIR` "
             "(harness/report/run_readme.py); edits here are overwritten.", "",
             "## Command", "", "```bash", command_line(config, run_dir), "```", "",
             "## Provenance", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in provenance], "",
             "## What it holds", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in facts if v], "",
             "## Files", "", *_links(run_dir), ""]
    headline = next((run_dir / "tables" / n for n in HEADLINE_TABLES if (run_dir / "tables" / n).exists()), None)
    if headline is not None:
        lines += [f"## {headline.name}", "", headline.read_text(encoding="utf-8").strip(), ""]
    return "\n".join(lines)


def write_run_readme(run_dir: Path, run: RunData | None = None) -> Path:
    """Write DIR/README.md (`run`: the folder's loaded records, when the caller has them)."""
    run = run or load_run(Path(run_dir))
    return write_atomic(Path(run_dir) / README, readme_text(run))


def write_report(run_dir: Path, ci: bool = False, tables: bool = True, plots: bool = True,
                 skip_invalid: bool = False) -> list[Path]:
    """Write DIR/tables/ (`ci`: intervals in the markdown too) and DIR/plots/, then DIR/README.md
    linking them; tables' paths first, the main markdown leading. The folder is held as its one
    writer meanwhile; `skip_invalid` leaves invalid records out, counted in the captions."""
    with hold(run_dir, "run folder"):
        stats = compute_stats(load_run(run_dir, skip_invalid))
        written = (write_tables(stats, ci) if tables else []) + (write_plots(stats) if plots else [])
        return [*written, write_run_readme(run_dir, stats.run)]
