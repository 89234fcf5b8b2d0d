"""Held-out top-1 over training, read from checkpoints' `train_log.jsonl`: the curve that shows
whether a training budget has flattened (`cli.py curves`).

Every trainer evaluation row holds `val_*acc*` keys: teacher-forced top-1 agreement with the
target on the held-out split, one per predicted depth (EAGLE's `val_acc`, Medusa/Hydra's
`val_acc0..`, Gumiho's serial `val_acc` and MLP heads `val_mlp<k>_acc`, rollout steps `val_acc<s>`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from harness.core.errors import SpecbenchError

_HEAD = re.compile(r"^val_acc(\d*)$")
_MLP = re.compile(r"^val_mlp(\d+)_acc$")


def metric_label(method: str, key: str) -> str | None:
    """A readable name for a held-out top-1 key, or None if `key` is not one."""
    if m := _MLP.match(key):
        return f"MLP head {int(m.group(1)) + 1} (depth {int(m.group(1)) + 3})"
    m = _HEAD.match(key)
    if not m:
        return None
    if method in ("medusa", "hydra"):
        return f"head {int(m.group(1) or 0) + 1}"
    return "next token" if not m.group(1) else f"rollout step {m.group(1)}"


def checkpoint_names(folders: list[Path]) -> list[str]:
    """A label per folder: its name, or as many trailing path parts as tell it apart from the
    others (`retrain/eagle` beside `smollm2-135m/eagle`)."""
    parts = [Path(f).resolve().parts for f in folders]
    for n in range(1, max((len(p) for p in parts), default=1) + 1):
        names = ["/".join(p[-n:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(f) for f in folders]  # the same folder twice


def read_curves(folders: list[Path]) -> pd.DataFrame:
    """One row per (checkpoint, metric, evaluation): columns checkpoint, method, target (config.json's,
    None where it names none), step, metric, top1.
    `step` counts a warm start's earlier steps too; a row logged twice (a run resumed from an
    earlier checkpoint) counts once, the later copy."""
    rows = []
    folders = [Path(f) for f in folders]
    for folder, name in zip(folders, checkpoint_names(folders)):
        log, config = folder / "train_log.jsonl", folder / "config.json"
        if not log.exists() or not config.exists():
            raise SpecbenchError(f"{folder}: no train_log.jsonl/config.json there; point at a folder `cli.py train` wrote")
        try:
            config_json = json.loads(config.read_text())
            method = config_json["method"]
            entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        except (ValueError, KeyError) as exc:
            raise SpecbenchError(f"{folder}: unreadable training record ({exc}); retrain or restore the file") from exc
        by_step: dict[int, dict] = {}
        for e in entries:
            if any(k.startswith("val_") for k in e):
                by_step[int(e.get("total_step", e["step"]))] = e
        for step, e in sorted(by_step.items()):
            for key, value in e.items():
                label = metric_label(method, key)
                if label is not None:
                    rows.append({"checkpoint": name, "method": method, "target": config_json.get("target"),
                                 "step": step, "metric": label, "top1": float(value)})
    if not rows:
        raise SpecbenchError("no held-out evaluations in these training logs (the trainer evaluates every `eval_every` steps)")
    return pd.DataFrame(rows)


def curves_markdown(frame: pd.DataFrame) -> str:
    """Markdown: per checkpoint and metric, held-out top-1 at each evaluation, and its slope over the
    last evaluation interval (points per 1,000 steps): near zero = flattened."""
    steps = sorted(frame["step"].unique())
    head = "| checkpoint | metric | " + " | ".join(str(s) for s in steps) + " | last slope (pts / 1k steps) |"
    lines = [head, "|" + "---|" * 2 + "--:|" * (len(steps) + 1)]
    for (ckpt, metric), g in frame.groupby(["checkpoint", "metric"], sort=False):
        at = dict(zip(g["step"], g["top1"]))
        cells = [f"{at[s]:.3f}" if s in at else "" for s in steps]
        end = max(at)
        prev = max((s for s in at if s < end), default=None)
        slope = "" if prev is None else f"{(at[end] - at[prev]) / (end - prev) * 1e5:+.1f}"
        lines.append(f"| {ckpt} | {metric} | " + " | ".join(cells) + f" | {slope} |")
    return "\n".join(lines) + "\n"
