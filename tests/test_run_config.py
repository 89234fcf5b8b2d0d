"""One RunConfig, built once from the command line: the config `run`, `compare` and `ablate` store
in meta.json is, for every committed run folder, the one that folder holds (its hash too, so the
folder resumes under today's code), and `run -t` takes the option as `compare -t` does."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from harness.core.hashing import config_hash
from harness.report.run_readme import command_line
from harness.runs import executor
from harness.runs.config import RunConfig

REPO = Path(__file__).resolve().parent.parent
# Run folders made by run/compare/ablate. A `cli.py peers` folder is left out: its command also runs
# the official implementations in their own environments, which this replay through run_grid skips.
FOLDERS = sorted(p.parent for p in (REPO / "results").rglob("records.jsonl")
                 if json.loads((p.parent / "meta.json").read_text())["config"].get("command") != "peers")


class Handed(Exception):
    """Raised by the stand-in backend: the grid it was handed is in `grid`."""

    def __init__(self, grid) -> None:
        super().__init__("handed to the backend")
        self.grid = grid


def handed_grid(args: list[str], data_dir: Path, monkeypatch):
    """The Grid `cli.py ARGS` hands its backend (no model loads, nothing is written)."""
    def start(backend, grid):
        raise Handed(grid)

    monkeypatch.setattr(executor, "load_target", lambda cfg, console: None)
    monkeypatch.setattr(executor.LocalBackend, "start", start)
    res = CliRunner().invoke(app, [*args, "--data-dir", str(data_dir)])
    assert isinstance(res.exception, Handed), res.output
    return res.exception.grid


def test_there_are_committed_folders_to_check():
    assert len(FOLDERS) >= 5


@pytest.mark.parametrize("folder", FOLDERS, ids=[str(f.relative_to(REPO / "results")) for f in FOLDERS])
def test_each_committed_folder_gets_its_own_config_back(folder, shared_data, monkeypatch):
    meta = json.loads((folder / "meta.json").read_text())
    want = {k: v for k, v in meta["config"].items() if k != "methods_resolved"}
    words = shlex.split(command_line(meta["config"], folder))
    assert words[:2] == ["python", "cli.py"]
    grid = handed_grid(words[2:], shared_data, monkeypatch)
    assert list(grid.stored.items()) == list(want.items())  # values and key order, as meta.json holds them
    assert config_hash({**grid.stored, "methods_resolved": meta["config"]["methods_resolved"]}) == meta["config_hash"]


def test_run_takes_t_as_compare_does(shared_data, monkeypatch, tmp_path):
    common = ["-m", "pld", "-b", "gsm8k", "--limit", "1", "--target", "tiny", "--out", str(tmp_path)]
    run = handed_grid(["run", "-t", "0.7", *common], shared_data, monkeypatch)
    grid = handed_grid(["compare", "-t", "0.7", *common], shared_data, monkeypatch)
    assert run.cfg == grid.cfg and run.cfg.temperatures == [0.7]
    # `run` stores the one-temperature form it always had; `compare` its grid form
    assert run.stored["temperature"] == 0.7 and run.stored["acceptance"] == "lossless" and "command" not in run.stored
    assert grid.stored["temperatures"] == [0.7] and grid.stored["command"] == "compare"


def test_preset_fills_only_what_was_not_given(shared_data, monkeypatch, tmp_path):
    base = ["compare", "-m", "pld", "-b", "gsm8k", "--target", "tiny", "--out", str(tmp_path), "--preset", "paper"]
    paper = handed_grid(base, shared_data, monkeypatch).cfg
    assert (paper.limit, paper.max_new_tokens) == (None, 512)
    given = handed_grid([*base, "--limit", "10", "--max-new-tokens", "128"], shared_data, monkeypatch).cfg
    assert (given.limit, given.max_new_tokens) == (10, 128)


def test_one_config_per_runner():
    cfg = RunConfig(methods=["pld", "medusa"], benchmarks=["gsm8k"], temperatures=[1.0, 0.0, 1.0], typical=["medusa"])
    runs = [(r.temperature, r.acceptance, r.methods) for r in cfg.runs()]
    assert runs == [(0.0, "greedy", ["pld", "medusa"]), (1.0, "lossless", ["pld", "medusa"]), (1.0, "typical", ["medusa"])]
    stored = cfg.to_dict("compare")
    assert stored["acceptance"] is None and stored["temperatures"] == [0.0, 1.0] and "temperature" not in stored
