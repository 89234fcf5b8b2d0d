"""`cli.py curves`: held-out top-1 per evaluation from training logs, a table and a plot."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app
from harness.report.training_curves import curves_markdown, read_curves

cli = CliRunner()


def _checkpoint(folder: Path, method: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"method": method}))
    (folder / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_curves_read_the_eval_rows_count_warm_starts_and_keep_the_later_duplicate(tmp_path):
    heads = _checkpoint(tmp_path / "hydra", "hydra", [
        {"step": 1, "loss": 3.0},                                   # not an evaluation
        {"step": 250, "val_acc0": 0.30, "val_acc1": 0.20, "val_loss": 2.0},
        {"step": 250, "val_acc0": 0.31, "val_acc1": 0.21},          # re-logged after a resume
        {"step": 500, "val_acc0": 0.40, "val_acc1": 0.25}])
    warm = _checkpoint(tmp_path / "gumiho", "gumiho", [
        {"step": 100, "total_step": 500, "val_acc": 0.50, "val_mlp0_acc": 0.30}])
    frame = read_curves([heads, warm])
    got = {(r.checkpoint, r.metric, r.step): r.top1 for r in frame.itertuples()}
    assert got == {("hydra", "head 1", 250): 0.31, ("hydra", "head 2", 250): 0.21, ("hydra", "head 1", 500): 0.40,
                   ("hydra", "head 2", 500): 0.25, ("gumiho", "next token", 500): 0.50,
                   ("gumiho", "MLP head 1 (depth 3)", 500): 0.30}
    table = curves_markdown(frame)
    # slope over the last interval, points per 1,000 steps: (0.40 - 0.31) / 250 * 1e5 = +36.0
    assert "| hydra | head 1 | 0.310 | 0.400 | +36.0 |" in table
    assert "| gumiho | next token |  | 0.500 |  |" in table


def test_curves_cli_writes_table_and_plot_and_refuses_a_folder_without_a_log(tmp_path):
    ck = _checkpoint(tmp_path / "eagle", "eagle", [{"step": 250, "val_acc": 0.4}, {"step": 500, "val_acc": 0.5}])
    res = cli.invoke(app, ["curves", str(ck), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"training-curves.md", "training-curves.png",
                                                              "training-curves.svg"}
    res = cli.invoke(app, ["curves", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "train_log.jsonl" in res.output


def test_checkpoints_of_one_name_are_told_apart(tmp_path):
    old = _checkpoint(tmp_path / "reference" / "eagle", "eagle", [{"step": 100, "val_acc": 0.4}])
    new = _checkpoint(tmp_path / "retrain" / "eagle", "eagle", [{"step": 100, "val_acc": 0.5}])
    frame = read_curves([old, new])
    assert sorted(zip(frame["checkpoint"], frame["top1"])) == [("reference/eagle", 0.4), ("retrain/eagle", 0.5)]
