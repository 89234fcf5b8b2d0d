"""What a careful user or a security reviewer tries on a run folder, each ending in one line and exit
code 2 (or a correct run), never a traceback or a silent wrong number:

1. provenance is the question lines the records answered, not a flag a later command overwrites;
2. two writers on one run folder: one runs, the other is refused naming the first's PID;
3. a record whose fields disagree is refused by line (or left out and counted, --skip-invalid);
4. no file the project loads can run a pickle's code;
5. bad values fail before the target loads and leave nothing behind; a folder without records
   takes a new config; a full disk keeps the previous files;
6. `regress` with a baseline value that is no number is "not comparable" (2), not "dropped" (1);
7. caps are said (a tree budget above a method's candidates), a local file failing its checksum
   is named and moved aside, and the docs say a plugin's code runs on import.

The target is the tiny random Llama with a byte chat (tests/test_grid_rules.py:_target); the
processes of (2) run the real CLI with that target (tests/tiny_cli.py).
"""
from __future__ import annotations

import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from cli import app
from harness.core.errors import SpecbenchError
from harness.runs import executor
from harness.runs.config import RunConfig
from harness.runs.executor import run_grid
from harness.runs.regress import save_baseline
from harness.runs.results import RunDir
from tests.test_faults import error_line
from tests.test_grid_rules import _target

REPO = Path(__file__).resolve().parent.parent
RUN = ["run", "-m", "pld", "-b", "gsm8k", "--limit", "2", "--target", "tiny", "--max-new-tokens", "12",
       "--dtype", "float32"]


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def tiny_model(monkeypatch) -> None:
    monkeypatch.setattr(executor, "load_target", lambda cfg, console: _target())


def no_model(monkeypatch) -> None:
    def loaded(cfg, console):
        raise AssertionError("the target loaded before the bad value was refused")

    monkeypatch.setattr(executor, "load_target", loaded)


def tiny_run(out: Path, data: Path) -> Path:
    """A finished pld run on the tiny target: 2 gsm8k questions, AR and pld."""
    cfg = RunConfig(methods=["pld"], benchmarks=["gsm8k"], target="tiny", limit=2, max_new_tokens=16, dtype="float32")
    return run_grid(cfg, out, data, Console(file=io.StringIO()), _target())


# ----------------------------------------------------------------------------- 1. provenance

def edited_copy(shared_data: Path, dest: Path) -> Path:
    """`dest` holding gsm8k/question.jsonl with every question's text changed."""
    lines = (shared_data / "gsm8k" / "question.jsonl").read_text(encoding="utf-8").splitlines()
    (dest / "gsm8k").mkdir(parents=True)
    edited = []
    for line in lines:
        q = json.loads(line)
        q["turns"] = [t + " Answer in French." for t in q["turns"]]
        edited.append(json.dumps(q))
    (dest / "gsm8k" / "question.jsonl").write_text("\n".join(edited) + "\n", encoding="utf-8")
    return dest


def test_official_comes_from_the_records_and_a_resume_from_other_lines_is_refused(shared_data, tmp_path,
                                                                                  monkeypatch):
    tiny_model(monkeypatch)
    edited, out = edited_copy(shared_data, tmp_path / "edited"), tmp_path / "run"
    assert cli(*RUN, "--data-dir", edited, "--out", out).exit_code == 0
    assert json.loads((out / "meta.json").read_text())["official_prompts"] == {"gsm8k": False}
    # The real files now: the answers in the folder are to other lines, so the resume is refused.
    line = error_line(cli(*RUN, "--data-dir", shared_data, "--out", out))
    assert str(shared_data / "gsm8k" / "question.jsonl") in line and "is not the line the answers" in line
    assert json.loads((out / "meta.json").read_text())["official_prompts"] == {"gsm8k": False}
    base = save_baseline(out, tmp_path / "edited.json", allow_dirty=True)
    assert base["provenance"]["prompts"]["gsm8k"]["official"] is False
    # The same run on the official files says so, in meta.json and in its baseline.
    real = tmp_path / "real"
    assert cli(*RUN, "--data-dir", shared_data, "--out", real).exit_code == 0
    assert json.loads((real / "meta.json").read_text())["official_prompts"] == {"gsm8k": True}
    assert save_baseline(real, tmp_path / "real.json", allow_dirty=True)["provenance"]["prompts"]["gsm8k"]["official"]


def test_the_question_hashes_are_those_of_the_official_files(shared_data):
    from harness.runs.benchmarks import BENCHMARKS, _file_path, line_hashes, official_line_hashes, verify_data_dir

    assert all(verify_data_dir(shared_data).values())
    assert official_line_hashes() == {b: line_hashes(_file_path(b, shared_data)) for b in BENCHMARKS}


# ----------------------------------------------------------------------------- 2. one writer

def _spawn(args: list, gate: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPECBENCH_TEST_GATE": str(gate), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.tiny_cli", *map(str, args)], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait(what, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "the processes never got there"
        time.sleep(0.05)


def test_two_writers_on_one_folder_one_runs_the_other_names_it(shared_data, tmp_path):
    out, gate = tmp_path / "run", tmp_path / "go"
    args = [*RUN, "--data-dir", shared_data, "--out", out]
    procs = [_spawn(args, gate, tmp_path / f"log{i}") for i in range(2)]
    waiting = lambda: list(tmp_path.glob("go.waiting-*"))  # noqa: E731
    # Both started together: wait until one was refused, or both hold a target (no lock at all).
    _wait(lambda: any(p.poll() is not None for p in procs) or len(waiting()) == 2)
    gate.touch()
    codes = [p.wait(timeout=300) for p in procs]
    assert sorted(codes) == [0, 2], [(tmp_path / f"log{i}").read_text() for i in range(2)]
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    said = (tmp_path / f"log{loser}").read_text()
    assert "Traceback" not in said and f"PID {procs[winner].pid}: cli.py run" in said, said
    assert "is being written by another process" in said
    keys = [r["key"] for r in RunDir(out).records()]
    assert len(keys) == len(set(keys)) == 4  # 2 questions x (AR, pld)
    assert not (out / ".lock").exists()


def test_the_lock_of_a_killed_writer_is_taken_over(shared_data, tmp_path):
    out, gate = tmp_path / "run", tmp_path / "go"
    args = [*RUN, "--data-dir", shared_data, "--out", out]
    held = _spawn(args, gate, tmp_path / "held")
    _wait(lambda: list(tmp_path.glob("go.waiting-*")))
    assert (out / ".lock").read_text().startswith(f"{held.pid} ")
    held.send_signal(signal.SIGKILL)
    held.wait()
    gate.touch()
    again = _spawn(args, gate, tmp_path / "again")
    assert again.wait(timeout=300) == 0, (tmp_path / "again").read_text()
    assert len(RunDir(out).records()) == 4 and not (out / ".lock").exists()


# ----------------------------------------------------------------------------- 3. records checked on read

def _tamper(rec: dict, how: str) -> None:
    steps = rec["steps"]
    if how == "sum":          # the issue's case: steps' tokens add up to more than the answer
        steps["tokens"][0] += 30
    elif how == "depth":      # more drafts accepted than the tree is deep (tokens still add up)
        steps["accepted"][0] = steps.get("tree_depth", steps["tree_size"])[0] + 1
        steps["tokens"][0] += steps["accepted"][0]
        steps["tokens"][1] -= steps["accepted"][0]
    else:                     # τ from the parts: a token moved from one step to another
        steps["tokens"][0] += 1
        steps["tokens"][1] -= 1


@pytest.mark.parametrize("how,needle", [("sum", "steps.tokens add up to"), ("depth", "from a tree of tree depth"),
                                        ("tau", "kept")])
def test_a_record_whose_fields_disagree_is_refused_by_line(shared_data, tmp_path, how, needle):
    out = tiny_run(tmp_path / "run", shared_data)
    save_baseline(out, tmp_path / "base.json", allow_dirty=True)
    lines = (out / "records.jsonl").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["method"] == "ar")
    rec = json.loads(lines[at])
    _tamper(rec, how)
    lines[at] = json.dumps(rec)
    (out / "records.jsonl").write_text("\n".join(lines) + "\n")
    line = error_line(cli("table", out))
    assert f"records.jsonl:{at + 1}: invalid record" in line and needle in line and "--skip-invalid" in line
    assert cli("table", out, "--skip-invalid").exit_code == 0
    assert "1 invalid record left out (--skip-invalid)" in (out / "tables" / "main.md").read_text()
    assert "invalid record" in error_line(cli("regress", out, "--baseline", tmp_path / "base.json"))


# ----------------------------------------------------------------------------- 4. pickles never run

class Payload:
    """Unpickled, it creates `marker`: proof that a load ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_no_file_the_project_loads_runs_a_pickle(tiny_target, tmp_path, monkeypatch):
    from harness.core.cost_model import _cache_file, verify_cost_curve
    from harness.train.features import load_feature_shards
    from harness.train.trainer import TrainConfig, Trainer
    from methods.common.checkpoint_io import read_state, read_weights
    from methods.registry import get_method

    marker = tmp_path / "it-ran"

    def plant(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"weight": Payload(marker)}, path)
        return path

    # Drafter weights in every layout: ours and the official ones (one file, or a folder of them).
    for name in ("model.safetensors", "pytorch_model.bin", "medusa_lm_head.pt", "hydra_lm_head.pt",
                 "model.pt"):
        with pytest.raises(SpecbenchError, match="not a readable weight file"):
            read_weights(plant(tmp_path / "weights" / name))
    with pytest.raises(SpecbenchError):
        read_state(plant(tmp_path / "official" / "pytorch_model.bin").parent)
    # A training run's resume state.
    out = tmp_path / "train"
    plant(out / "trainer_state.pt")
    with pytest.raises(SpecbenchError, match="trainer_state.pt is not a trainer state"):
        Trainer(get_method("medusa")(tiny_target, {"heads": 1}), None, TrainConfig(), out).try_resume()
    # Feature caches (safetensors) and cost curves (JSON).
    with pytest.raises(Exception):  # noqa: B017 - safetensors refuses a pickle in its own words
        load_feature_shards(plant(tmp_path / "features" / "shard-00000.safetensors").parent)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    plant(_cache_file(tiny_target))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a busy machine's curve is not cached: said, and beside the point here
        assert verify_cost_curve(tiny_target, repeats=1)  # measured again, the planted file ignored
    assert not marker.exists()


def test_a_trainer_state_of_this_code_resumes_with_weights_only(tiny_target, tmp_path):
    from harness.train.trainer import TrainConfig, Trainer, load_state
    from methods.registry import get_method
    from tests.train_helpers import tiny_dataset

    data = tiny_dataset(tiny_target, n=16, new_tokens=16)
    cfg = TrainConfig(steps=3, warmup=1, tokens_per_batch=256, max_len=64, save_every=2, eval_every=10,
                      eval_batches=1, autocast="off")
    first = Trainer(get_method("medusa")(tiny_target, {"heads": 1}), data, cfg, tmp_path)
    first.train()
    state = load_state(tmp_path / "trainer_state.pt")
    assert state["step"] == 3 and isinstance(state["sessions"][0]["torch"], str)
    again = Trainer(get_method("medusa")(tiny_target, {"heads": 1}), data, cfg, tmp_path)
    assert again.try_resume() and again.step == 3


# ----------------------------------------------------------------------------- 5. checked before the target loads

@pytest.mark.parametrize("args,needle", [
    (["-m", "eagle2", "--set", "eagle2.total_tokens=abc"], "total_tokens='abc' is not an integer >= 2, or auto"),
    (["-m", "pld", "--set", "max_draft=2.5"], "max_draft=2.5 is not an integer >= 1"),
    (["-m", "pld", "-t", "nan"], "--temperature must be >= 0 and finite, got nan"),
    (["-m", "pld", "-t", "inf"], "--temperature must be >= 0 and finite, got inf"),
    (["-m", "eagle2", "--tree-budget", "100000"], "its tree keeps at most 264"),
    (["-m", "pld", "-b", "empty=EMPTY"], "holds no questions"),
])
def test_a_bad_value_is_one_line_before_the_target_loads_and_leaves_nothing(shared_data, tmp_path, monkeypatch,
                                                                            args, needle):
    no_model(monkeypatch)
    (tmp_path / "empty.jsonl").write_text("\n")
    args = [a.replace("EMPTY", str(tmp_path / "empty.jsonl")) for a in args]
    out = tmp_path / "run"
    line = error_line(cli("run", *args, "--target", "tiny", "--limit", "1", "--data-dir", shared_data, "--out", out))
    assert needle in line
    assert not out.exists()  # no meta.json, no folder


@pytest.mark.parametrize("out,needle", [("FILE", "is a file, not a folder"),
                                        ("/proc/specbench-out", "cannot make this folder")])
def test_an_out_that_is_no_writable_folder_is_one_line(shared_data, tmp_path, monkeypatch, out, needle):
    no_model(monkeypatch)
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "file") if out == "FILE" else out
    assert needle in error_line(cli(*RUN, "--data-dir", shared_data, "--out", out))


def test_a_folder_without_records_takes_a_new_config(shared_data, tmp_path, monkeypatch):
    tiny_model(monkeypatch)
    out = tmp_path / "run"
    out.mkdir()
    RunDir(out).open({"methods": ["eagle2"], "settings": {"eagle2.total_tokens": "abc"}})  # refused later
    assert cli(*RUN, "--data-dir", shared_data, "--out", out).exit_code == 0
    assert json.loads((out / "meta.json").read_text())["config"]["methods"] == ["pld"]


def _full_disk():
    """A child whose writes fail past a few hundred bytes, as on a full disk (EFBIG, not a signal)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))


@pytest.mark.parametrize("command,file", [("summary", "summary.csv"), ("table", "tables/main.md")])
def test_a_full_disk_keeps_the_previous_file_and_says_so_in_one_line(shared_data, tmp_path, command, file):
    out = tiny_run(tmp_path / "run", shared_data)
    cli("table", out)
    before = (out / file).read_bytes()
    assert len(before) > 200
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "cli.py", command, str(out)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, preexec_fn=_full_disk)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("error: could not write") and "File too large" in res.stderr, res.stderr
    assert (out / file).read_bytes() == before
    assert not [p for p in out.rglob("*.tmp")]


# ----------------------------------------------------------------------------- 6. regress

def test_regress_with_a_baseline_value_that_is_no_number_is_not_comparable(shared_data, tmp_path):
    out = tiny_run(tmp_path / "run", shared_data)
    base = save_baseline(out, tmp_path / "base.json", allow_dirty=True)
    base["cells"][0]["tau"] = "abc"
    (tmp_path / "base.json").write_text(json.dumps(base))
    line = error_line(cli("regress", out, "--baseline", tmp_path / "base.json"))
    assert "cells[0].tau is 'abc', not a positive number" in line


# ----------------------------------------------------------------------------- 7. caps, checksums, plugins

def test_a_heads_tree_budget_above_its_fitted_candidates_is_refused(tiny_target):
    from methods.registry import get_method

    candidates = [[[0], 0.6], [[1], 0.3], [[0, 0], 0.2]]
    with pytest.raises(SpecbenchError, match="asks for 5 draft nodes, but these heads have 3 fitted candidates"):
        get_method("medusa")(tiny_target, {"heads": 2, "tree": "auto:5", "tree_candidates": candidates})
    assert get_method("medusa")(tiny_target, {"heads": 2, "tree": "auto:3", "tree_candidates": candidates}).tree
    with pytest.raises(SpecbenchError, match="use auto or auto:N"):  # before any model: the config alone
        get_method("medusa").resolve_config({"tree": "auto:many"})


def test_fetch_data_names_a_local_file_that_fails_its_checksum_and_moves_it_aside(shared_data, tmp_path):
    import urllib.error

    from harness.runs.benchmarks import fetch_data

    local = tmp_path / "gsm8k" / "question.jsonl"
    local.parent.mkdir()
    local.write_bytes((shared_data / "gsm8k" / "question.jsonl").read_bytes() + b"\n")

    def offline(url: str):
        raise urllib.error.URLError("no route to host")

    with pytest.raises(SpecbenchError) as exc:
        fetch_data(tmp_path, ["gsm8k"], opener=offline)
    assert f"{local} failed its checksum" in str(exc.value) and "moved aside" in str(exc.value)
    assert not local.exists() and len(list(local.parent.glob("question.jsonl.bad-*"))) == 1


def test_the_docs_say_a_plugin_runs_its_code_on_import():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Your own drafter"):readme.index("## The regression gate")]
    assert "imported like any Python import" in section and "name only packages you trust" in section
