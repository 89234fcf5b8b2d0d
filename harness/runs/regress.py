"""τ baselines and regression checks.

Greedy τ on CPU in float32 is deterministic, so it is what regression tracking compares; seconds
are not (they go into the history file for the record, never into a pass/fail).

- `save_baseline(run_dir, file, methods=None)`: per cell (method, benchmark, temperature,
  acceptance) the numeric τ and per-depth acceptance, with the run's provenance (target, dtype,
  device, CPU flags or GPU name, prompts, max new tokens, drafter checkpoint hashes). Any method
  the run holds may be baselined, an external `module:Class` drafter included: cells are keyed by
  the names the records carry, never checked against a static list.
- `check(run_dir, file, tolerance, depth_tolerance)`: refuses (SpecbenchError, the CLI's exit 2) a
  run whose provenance differs in a field that can change τ at its dtype, naming the field (other
  differences, e.g. AMX in float32, are warnings); otherwise compares cell by cell: a τ more than
  `tolerance` (relative) below the baseline, a depth's acceptance more than `depth_tolerance`
  (relative) below the baseline's at that depth, or a baseline cell missing from the run, fails.
  Depth d's acceptance is the share of verify steps that accepted at least d drafts; as in vLLM's
  acceptance-length test, every position with a non-zero baseline is gated one-sided, so a drafter
  whose deep positions collapse fails even when a better first position keeps τ level.
The τ history across commits, from the same cells, is harness/runs/history.py.
τ, speedup and per-depth acceptance are the named metrics of the tables (harness/runs/metrics.py),
without their bootstrap.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import SpecbenchError
from harness.core.hardware import BF16_KERNEL_FLAGS, cpu_kind
from harness.core.paths import repo_relative
from harness.core.files import write_atomic
from harness.runs.benchmarks import official_prompts
from harness.runs.folder_lock import hold
from harness.runs.metrics import SPEEDUP, TAU, ar_by_prompt, per_depth_acceptance
from harness.runs.results import refuse_dirty
from harness.runs.run_data import RunData, fmt_temperature, load_run

FORMAT = "specbench-baseline/1"
DEFAULT_TOLERANCE = 0.02
EPS = 1e-9


# ----------------------------------------------------------------------------- cells and provenance

def run_cells(run: RunData) -> list[dict[str, Any]]:
    """Per (method, benchmark, temperature, acceptance) of a run: τ, speedup, answers, per-depth
    acceptance, config and checkpoint hash. AR is left out (its τ is 1 by construction)."""
    ar = ar_by_prompt(run.records)
    out = []
    for row in run.rows:
        for b in run.benchmarks:
            recs = run.row_records(row, b)
            if not recs:
                continue
            speedup = SPEEDUP.of(recs, ar)
            out.append({
                "method": row.name, "benchmark": b, "temperature": row.temperature, "acceptance": row.acceptance,
                "lossy": row.lossy, "tau": TAU.of(recs), "speedup": None if math.isnan(speedup) else speedup,
                "answers": len(recs), "per_depth": [round(x, 6) for x in per_depth_acceptance(recs)],
                "config_hash": row.config_hash, "checkpoint_hash": recs[0].checkpoint_hash,
            })
    return out


def _one(values: set, what: str, run_dir: Path) -> Any:
    values = {v for v in values if v is not None}
    if len(values) > 1:
        raise SpecbenchError(f"{run_dir} mixes several {what}s ({', '.join(map(str, sorted(values)))}): "
                             "baselines need one")
    return next(iter(values), None)


def provenance(run: RunData) -> dict[str, Any]:
    """What must match for two runs' τ to be comparable, from meta.json and the records."""
    run_dir = run.path
    meta, config = run.meta, run.meta.get("config", {})
    device = _one({str(r.device).split(":")[0] for r in run.records}, "device", run_dir)
    # Official or not from the question lines the records answered (None: records without them).
    official = official_prompts((r.benchmark, r.question_id, r.question_sha256) for r in run.records)
    prompts: dict[str, Any] = {}
    for b in run.benchmarks:
        turns = sorted({(r.question_id, r.turn) for r in run.records if r.benchmark == b})
        first = sorted({(r.question_id, r.prompt_tokens) for r in run.records if r.benchmark == b and r.turn == 0})
        digest = hashlib.sha256(json.dumps([turns, first]).encode()).hexdigest()[:12]
        prompts[b] = {"questions": sorted({q for q, _ in turns}), "answers_per_method": len(turns),
                      "digest": digest, "official": official.get(b)}
    checkpoints: dict[str, Any] = {}
    for r in run.records:
        if not r.is_ar:
            checkpoints.setdefault(r.method, set()).add(r.checkpoint_hash)
    return {
        "target": _one({r.target for r in run.records}, "target", run_dir),
        "dtype": _one({r.dtype for r in run.records}, "dtype", run_dir),
        "device": device,
        "cpu_flags": meta.get("cpu_flags") if device == "cpu" else None,
        "cpu_model": meta.get("cpu_model") if device == "cpu" else None,
        "gpu": meta.get("gpu") if device != "cpu" else None,
        "max_new_tokens": config.get("max_new_tokens"),
        "settings": config.get("settings") or {},  # --set of the run, to remake it (cells carry each method's hash)
        "prompts": prompts,
        "checkpoints": {m: sorted(v, key=str)[0] if len(v) == 1 else sorted(map(str, v))
                        for m, v in checkpoints.items()},
    }


def machine(prov: dict[str, Any]) -> str:
    """One line naming the machine a provenance was measured on."""
    if prov.get("device") not in (None, "cpu"):
        return f"{prov.get('device')}: {prov.get('gpu') or 'unknown GPU'}"
    return cpu_kind(prov.get("cpu_model") or "unknown CPU", prov.get("cpu_flags") or {})


# ----------------------------------------------------------------------------- baseline

def run_method_names(run: RunData, wanted: list[str]) -> set[str]:
    """The run's method names that `wanted` names: each is a name the records carry, or anything
    `methods.registry.get_method` resolves (an alias, `module:Class`, an entry point) to a class
    whose `name` the records carry. Nothing is checked against a static list of methods."""
    have = {row.method for row in run.rows}
    out = set()
    for name in wanted:
        if name in have:
            out.add(name)
            continue
        try:
            from methods.registry import get_method  # lazy: only for names the records do not carry

            resolved = getattr(get_method(name), "name", None)
        except Exception:  # noqa: BLE001 - unresolvable: the error below names what the run holds
            resolved = None
        if resolved not in have:
            raise SpecbenchError(f"{run.path} has no cells of method {name!r}; it holds {', '.join(sorted(have))}")
        out.add(resolved)
    return out


def save_baseline(run_dir: Path, file: Path, allow_dirty: bool = False,
                  methods: list[str] | None = None) -> dict[str, Any]:
    """Write the baseline of `run_dir` (only `methods`' cells when given) to `file`; the run
    folder is held meanwhile, so a baseline is never taken of a run still being written."""
    with hold(run_dir, "run folder"):
        return _save_baseline(run_dir, file, allow_dirty, methods)


def _save_baseline(run_dir: Path, file: Path, allow_dirty: bool, methods: list[str] | None) -> dict[str, Any]:
    run = load_run(run_dir)
    refuse_dirty(run.meta, "baseline --save", allow_dirty)
    cells = run_cells(run)
    if methods:
        keep = run_method_names(run, methods)
        cells = [c for c in cells if c["method"] in keep]
    if not cells:
        raise SpecbenchError(f"{run_dir} has no method cells to baseline")
    meta = run.meta
    prov = provenance(run)
    if methods:
        prov["checkpoints"] = {m: h for m, h in prov["checkpoints"].items() if m in keep}
    baseline = {
        "format": FORMAT,
        "source": {"run_dir": repo_relative(run_dir), "commit": meta.get("commit"), "dirty": meta.get("dirty"),
                   "date": meta.get("date"), "config_hash": meta.get("config_hash")},
        "provenance": prov,
        "cells": [{k: c[k] for k in ("method", "benchmark", "temperature", "acceptance", "tau", "per_depth",
                                     "answers", "speedup", "config_hash", "checkpoint_hash")} for c in cells],
    }
    write_atomic(file, _dump(baseline))
    return baseline


def _dump(data: dict[str, Any]) -> str:
    """Indented JSON with every list of numbers or strings on one line, so diffs read per cell."""
    text = json.dumps(data, indent=1)
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "]", text) + "\n"


def load_baseline(file: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(file).read_text())
    except FileNotFoundError:
        raise SpecbenchError(
            f"baseline {file} not found; save one with `cli.py baseline RUN_DIR --save {file}`") from None
    except json.JSONDecodeError as e:
        raise SpecbenchError(f"baseline {file} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("cells"), list):
        raise SpecbenchError(f"{file} is not a specbench baseline (format {FORMAT})")
    problem = baseline_problem(data)
    if problem:
        raise SpecbenchError(f"baseline {file}: {problem}; save it again with `cli.py baseline RUN_DIR --save {file}`")
    return data


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def baseline_problem(data: dict[str, Any]) -> str | None:
    """The first field of a baseline that is not what `save_baseline` writes, named, or None: a
    malformed baseline is 'not comparable' (exit 2), never a traceback or a verdict."""
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        return "provenance is not an object"
    for name in ("target", "dtype", "device", "gpu", "cpu_model"):
        if prov.get(name) is not None and not isinstance(prov[name], str):
            return f"provenance.{name} is {prov[name]!r}, not a string"
    if prov.get("max_new_tokens") is not None and not _number(prov["max_new_tokens"]):
        return f"provenance.max_new_tokens is {prov['max_new_tokens']!r}, not a number"
    for name in ("prompts", "checkpoints", "cpu_flags"):
        if prov.get(name) is not None and not isinstance(prov[name], dict):
            return f"provenance.{name} is not an object"
    for b, p in (prov.get("prompts") or {}).items():
        if not isinstance(p, dict) or not isinstance(p.get("questions"), list):
            return f"provenance.prompts.{b} has no list of questions"
    for i, c in enumerate(data["cells"]):
        where = f"cells[{i}]"
        if not isinstance(c, dict):
            return f"{where} is not an object"
        for name in ("method", "benchmark", "acceptance"):
            if not isinstance(c.get(name), str):
                return f"{where}.{name} is {c.get(name)!r}, not a string"
        if not _number(c.get("temperature")):
            return f"{where}.temperature is {c.get('temperature')!r}, not a number"
        if not _number(c.get("tau")) or c["tau"] <= 0:
            return f"{where}.tau is {c.get('tau')!r}, not a positive number"
        depths = c.get("per_depth") or []
        if not isinstance(depths, list) or not all(_number(x) for x in depths):
            return f"{where}.per_depth is {c.get('per_depth')!r}, not a list of numbers"
        if c.get("config_hash") is not None and not isinstance(c["config_hash"], str):
            return f"{where}.config_hash is {c['config_hash']!r}, not a string"
    return None


# ----------------------------------------------------------------------------- regress

@dataclass
class Verdict:
    rows: list[dict[str, Any]]   # every baseline cell with status ok | improved | dropped | missing
    tolerance: float
    warnings: list[str] = field(default_factory=list)   # provenance that differs without changing τ
    machines: dict[str, str] = field(default_factory=dict)  # {"baseline": ..., "run": ...}
    depth_tolerance: float | None = None  # relative, per depth; None: `tolerance`

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] in ("dropped", "missing")]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def write_verdict(verdict: Verdict, file: Path, run_dir: Path, baseline_file: Path) -> None:
    """The verdict as JSON: both machines, the warnings and every cell's status."""
    data = {"run_dir": repo_relative(run_dir), "baseline": repo_relative(baseline_file), "machines": verdict.machines,
            "warnings": verdict.warnings, "tolerance": verdict.tolerance, "depth_tolerance": verdict.depth_tolerance,
            "exit_code": verdict.exit_code, "cells": verdict.rows}
    write_atomic(file, _dump(data))


def cell_name(c: dict[str, Any]) -> str:
    return f"{c['method']} {c['benchmark']} T={fmt_temperature(float(c['temperature']))} {c['acceptance']}"


def _show(v: Any) -> str:
    return json.dumps(v, default=str) if not isinstance(v, str) else v


def _refuse(name: str, old: Any, new: Any) -> SpecbenchError:
    return SpecbenchError(f"refusing to compare: {name} differs (baseline {_show(old)}, run {_show(new)}); "
                          "save a baseline from a run made like this one")


def check_provenance(base: dict[str, Any], run: dict[str, Any], methods: set[str], benchmarks: set[str]) -> list[str]:
    """Raise naming the first field where the run cannot be compared with the baseline; return a
    warning line for each field that differs but cannot change τ at this dtype.

    What can change greedy τ is what can flip a token: the model, dtype, prompts, drafter weights,
    and the kernels. On a CPU, float32 GEMMs use FMA kernels whatever the bf16 flags say, so AMX or
    AVX512-BF16 change no float32 result the baseline holds (checked: the float32 reference
    baseline, made on Sapphire Rapids with AMX, gives the same τ in every cell on an AMD EPYC
    without AMX); in bf16/fp16 those flags pick other kernels with other rounding, so they refuse.
    A GPU's name always refuses: its float32 GEMMs differ by architecture (TF32, split-K).
    """
    for name in ("target", "dtype", "device", "max_new_tokens", "gpu"):
        if base.get(name) != run.get(name):
            raise _refuse(name, base.get(name), run.get(name))
    warnings = []
    kernel_sensitive = base.get("dtype") != "float32"
    bflags, rflags = base.get("cpu_flags") or {}, run.get("cpu_flags") or {}
    for flag in sorted(set(bflags) | set(rflags)):
        if bflags.get(flag) != rflags.get(flag):
            if kernel_sensitive and flag in BF16_KERNEL_FLAGS:
                raise _refuse(f"cpu_flags.{flag}", bflags.get(flag), rflags.get(flag))
            warnings.append(f"cpu_flags.{flag} differs (baseline {_show(bflags.get(flag))}, run "
                            f"{_show(rflags.get(flag))}): no effect on {base.get('dtype')} τ, compared anyway")
    if base.get("cpu_model") and run.get("cpu_model") and base["cpu_model"] != run["cpu_model"]:
        warnings.append(f"cpu_model differs (baseline {base['cpu_model']}, run {run['cpu_model']}): compared anyway")
    for b in sorted(benchmarks):
        old, new = base["prompts"].get(b), run["prompts"].get(b)
        if new is None:
            continue  # the benchmark is absent from the run: its cells are reported missing
        if old is None:
            continue
        if old["questions"] != new["questions"]:
            raise _refuse(f"prompts of {b} (question ids)", old["questions"], new["questions"])
        for key in ("answers_per_method", "digest", "official"):
            if old.get(key) == new.get(key):
                continue
            if key == "official" and None in (old.get(key), new.get(key)):
                side = "baseline" if old.get(key) is None else "run"
                warnings.append(f"prompts of {b}: whether the {side}'s are the official ones is unknown (its records "
                                "were written before they kept their question's hash): compared anyway")
                continue
            raise _refuse(f"prompts of {b} ({key})", old.get(key), new.get(key))
    for m in sorted(methods):
        if m in run["checkpoints"] and base["checkpoints"].get(m) != run["checkpoints"][m]:
            raise _refuse(f"drafter checkpoint hash of {m}", base["checkpoints"].get(m), run["checkpoints"][m])
    return warnings


def _moved(old: float, new: float, tolerance: float) -> str:
    """ok | dropped | improved: `new` against `old` with a relative tolerance."""
    if new < old * (1 - tolerance) - EPS:
        return "dropped"
    return "improved" if new > old * (1 + tolerance) + EPS else "ok"


def depth_moves(base: list[float], run: list[float], tolerance: float) -> list[dict[str, Any]]:
    """The depths whose acceptance moved beyond `tolerance` (relative): [{depth, baseline, run,
    change, status}], depth 1-based. Depths with a zero baseline are not gated (a relative change
    from 0 is undefined; vLLM's test skips them too); a depth the run never reached counts 0."""
    out = []
    for d, old in enumerate(base, start=1):
        new = run[d - 1] if d <= len(run) else 0.0
        status = _moved(old, new, tolerance) if old > 0 else "ok"
        if status != "ok":
            out.append({"depth": d, "baseline": old, "run": new, "change": new / old - 1, "status": status})
    return out


def describe_moves(row: dict[str, Any]) -> list[str]:
    """One phrase per quantity of a verdict row that moved: 'τ 1.5000 -> 1.4000 (-6.7%)',
    'depth 2 acceptance 0.4000 -> 0.3500 (-12.5%)', or 'missing from the run'."""
    if row["status"] == "missing":
        return ["missing from the run"]
    out = []
    if row.get("tau_status", "ok") != "ok":
        out.append(f"τ {row['baseline_tau']:.4f} -> {row['tau']:.4f} ({100 * row['change']:+.1f}%)")
    out += [f"depth {m['depth']} acceptance {m['baseline']:.4f} -> {m['run']:.4f} ({100 * m['change']:+.1f}%)"
            for m in row.get("depths") or []]
    return out


def check(run_dir: Path, baseline_file: Path, tolerance: float = DEFAULT_TOLERANCE,
          depth_tolerance: float | None = None) -> Verdict:
    """Compare `run_dir` with a baseline cell by cell: τ within `tolerance`, every depth's
    acceptance within `depth_tolerance` (default: `tolerance`), both relative and one-sided."""
    for name, value in (("--tolerance", tolerance), ("--depth-tolerance", depth_tolerance)):
        if value is not None and not 0 <= value < 1:
            raise SpecbenchError(f"{name} is relative, in [0, 1): got {value}")
    dtol = tolerance if depth_tolerance is None else depth_tolerance
    base = load_baseline(baseline_file)
    run = load_run(run_dir)
    cells = run_cells(run)
    prov = provenance(run)
    bcells = base["cells"]
    warnings = check_provenance(base["provenance"], prov, {c["method"] for c in bcells},
                                {c["benchmark"] for c in bcells})
    exact = {(c["method"], c["benchmark"], float(c["temperature"]), c["acceptance"]): c for c in cells}
    loose = {(c["method"], c["benchmark"], float(c["temperature"])): c for c in cells}
    rows = []
    for b in bcells:
        key = (b["method"], b["benchmark"], float(b["temperature"]))
        got = exact.get((*key, b["acceptance"]))
        if got is None and key in loose:
            raise _refuse(f"acceptance rule of {b['method']} {b['benchmark']} T={fmt_temperature(key[2])}",
                          b["acceptance"], loose[key]["acceptance"])
        if got is not None and b.get("config_hash") and got.get("config_hash") != b["config_hash"]:
            # e.g. a tree budget: τ moves with it, so a changed default must not pass as a drop or a gain
            raise _refuse(f"method settings of {b['method']} (config hash)", b["config_hash"], got.get("config_hash"))
        row = {**{k: b[k] for k in ("method", "benchmark", "temperature", "acceptance")},
               "baseline_tau": b["tau"], "tau": None, "change": None, "status": "missing", "tau_status": None,
               "baseline_depth1": (b.get("per_depth") or [None])[0], "depth1": None, "depths": []}
        if got is not None and got["tau"] is not None and not math.isnan(got["tau"]):
            change = got["tau"] / b["tau"] - 1 if b["tau"] else 0.0
            tau_status = _moved(b["tau"], got["tau"], tolerance)
            depths = depth_moves(b.get("per_depth") or [], got["per_depth"] or [], dtol)
            statuses = {tau_status, *(m["status"] for m in depths)}
            status = "dropped" if "dropped" in statuses else ("improved" if "improved" in statuses else "ok")
            row.update(tau=got["tau"], change=change, status=status, tau_status=tau_status, depths=depths,
                       depth1=(got["per_depth"] or [None])[0])
        rows.append(row)
    return Verdict(rows, tolerance, warnings, {"baseline": machine(base["provenance"]), "run": machine(prov)}, dtol)
