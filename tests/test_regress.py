"""Baselines, regress exit codes (0 / 1 / 2 naming the field) and the τ history, on synthetic runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from harness.core.errors import SpecbenchError
from harness.runs import regress
from tests.test_report import write_run

cli = CliRunner()


@pytest.fixture(autouse=True)
def real_history_untouched():
    """No test may append to the committed results/history.jsonl."""
    path = regress.HISTORY_FILE
    before = path.read_bytes() if path.exists() else None
    yield
    assert (path.read_bytes() if path.exists() else None) == before


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path / "run", methods=("pld", "eagle"), temperatures=(0.0, 1.0))


@pytest.fixture
def baseline(run_dir, tmp_path):
    path = tmp_path / "baselines" / "base.json"
    assert cli.invoke(app, ["baseline", str(run_dir), "--save", str(path)]).exit_code == 0
    return path


def edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def edit_records(run_dir: Path, fn) -> None:
    lines = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()]
    kept = [r for r in lines if fn(r) is not False]
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))


def regress_cli(run_dir, baseline, *extra):
    return cli.invoke(app, ["regress", str(run_dir), "--baseline", str(baseline), *extra])


def test_baseline_holds_cells_and_provenance(baseline):
    data = json.loads(baseline.read_text())
    assert data["format"] == regress.FORMAT
    # 2 methods x 2 benchmarks x 2 temperatures; AR is not a cell.
    assert len(data["cells"]) == 8 and {c["method"] for c in data["cells"]} == {"pld", "eagle"}
    cell = data["cells"][0]
    assert set(cell) >= {"method", "benchmark", "temperature", "acceptance", "tau", "per_depth"}
    assert isinstance(cell["tau"], float) and cell["per_depth"][0] >= cell["per_depth"][-1]
    prov = data["provenance"]
    assert prov["target"] == "tiny" and prov["dtype"] == "float32" and prov["max_new_tokens"] == 40
    assert prov["checkpoints"] == {"pld": None, "eagle": "ck-eagle"}
    assert prov["prompts"]["mt_bench"]["questions"] == [100, 101, 102, 103]


def test_same_run_passes(run_dir, baseline):
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 0, res.output
    assert "ok: 8 cells within 2%" in res.output


def test_tau_raised_ten_percent_fails_and_names_the_cell(run_dir, baseline):
    def bump(data):
        cell = next(c for c in data["cells"] if c["method"] == "eagle" and c["benchmark"] == "gsm8k"
                    and c["temperature"] == 0)
        cell["tau"] *= 1.10
    edit_json(baseline, bump)
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 1, res.output
    assert "regressed: eagle gsm8k T=0 greedy" in res.output and "-9.1%" in res.output
    assert "1 of 8 cells failed" in res.output


def test_tolerance_is_relative(run_dir, baseline):
    edit_json(baseline, lambda d: d["cells"][0].update(tau=d["cells"][0]["tau"] * 1.01))
    assert regress_cli(run_dir, baseline).exit_code == 0
    assert regress_cli(run_dir, baseline, "--tolerance", "0.005").exit_code == 1
    res = regress_cli(run_dir, baseline, "--tolerance", "1.5")
    assert res.exit_code == 2 and "--tolerance" in res.output


def test_improvement_passes(run_dir, baseline):
    edit_json(baseline, lambda d: d["cells"][0].update(tau=d["cells"][0]["tau"] * 0.8))
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 0 and "improved" in res.output


def test_missing_cell_fails(run_dir, baseline):
    edit_records(run_dir, lambda r: not (r["method"] == "pld" and r["benchmark"] == "gsm8k" and r["temperature"] == 1))
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 1, res.output
    assert "regressed: pld gsm8k T=1 lossless: missing from the run" in res.output


def test_run_with_extra_cells_passes(run_dir, tmp_path):
    small = write_run(tmp_path / "small", methods=("pld",), temperatures=(0.0,))
    base = tmp_path / "small.json"
    regress.save_baseline(small, base)
    assert regress.check(run_dir, base).exit_code == 0


@pytest.mark.parametrize("change,field", [
    (lambda run, meta: edit_records(run, lambda r: r.update(dtype="bfloat16")), "dtype"),
    (lambda run, meta: edit_records(run, lambda r: r.update(target="other")), "target"),
    (lambda run, meta: edit_records(run, lambda r: r.update(device="cuda")), "device"),
    (lambda run, meta: edit_json(meta, lambda m: m["config"].update(max_new_tokens=64)), "max_new_tokens"),
    (lambda run, meta: edit_records(run, lambda r: r["question_id"] != 103 or r["benchmark"] != "mt_bench"),
     "prompts of mt_bench (question ids)"),
    (lambda run, meta: edit_records(run, lambda r: r.update(prompt_tokens=99) if (r["question_id"], r["benchmark"])
                                    == (100, "mt_bench") else None), "prompts of mt_bench (digest)"),
    (lambda run, meta: edit_records(run, lambda r: r.update(checkpoint_hash="ck-new") if r["method"] == "eagle"
                                    else None), "drafter checkpoint hash of eagle"),
    (lambda run, meta: edit_records(run, lambda r: r.update(config_hash="other-tree", key=None)
                                    if r["method"] == "eagle" else None), "method settings of eagle"),
    (lambda run, meta: edit_records(run, lambda r: r.update(acceptance="typical", key=None)
                                    if (r["method"], r["temperature"]) == ("pld", 1) else None),
     "acceptance rule of pld"),
])
def test_provenance_mismatch_is_refused_with_exit_2(run_dir, baseline, change, field):
    change(run_dir, run_dir / "meta.json")
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert text.startswith("error: refusing to compare") and field in text, text


def test_reference_results_come_from_a_clean_tree(run_dir, tmp_path):
    """`baseline --save` and `compare --record` refuse a run made from uncommitted changes
    (or resumed from them) unless --allow-dirty; the baseline names its run folder relative to
    the repository, never by a path of the machine that made it."""
    edit_json(run_dir / "meta.json", lambda m: m.update(dirty=True))
    res = cli.invoke(app, ["baseline", str(run_dir), "--save", str(tmp_path / "b.json")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "--allow-dirty" in res.output
    with pytest.raises(SpecbenchError, match="uncommitted"):
        regress.record_history(run_dir, tmp_path / "h.jsonl")
    edit_json(run_dir / "meta.json", lambda m: m.update(dirty=False, resumed_at=[{"commit": "x", "dirty": True}]))
    assert cli.invoke(app, ["baseline", str(run_dir), "--save", str(tmp_path / "b.json")]).exit_code == 2
    res = cli.invoke(app, ["baseline", str(run_dir), "--save", str(tmp_path / "b.json"), "--allow-dirty"])
    assert res.exit_code == 0, res.output
    source = json.loads((tmp_path / "b.json").read_text())["source"]["run_dir"]
    assert source == "<outside the repository>/" + "/".join(run_dir.parts[-2:])
    inside = regress.REPO_ROOT / "results" / "runs" / "x"
    from harness.core.paths import repo_relative
    assert repo_relative(inside) == "results/runs/x"


def test_bad_baseline_file_is_one_line(run_dir, tmp_path):
    res = regress_cli(run_dir, tmp_path / "nope.json")
    assert res.exit_code == 2 and "not found" in res.output
    (tmp_path / "x.json").write_text('{"a": 1}')
    res = regress_cli(run_dir, tmp_path / "x.json")
    assert res.exit_code == 2 and "not a specbench baseline" in res.output


# ----------------------------------------------------------------------------- history

def test_history_records_and_plots(tmp_path):
    hist = tmp_path / "history.jsonl"
    for i, commit in enumerate(("aaa1111", "bbb2222", "ccc3333")):
        run = write_run(tmp_path / f"r{i}", methods=("pld", "eagle"), seed=i)
        edit_json(run / "meta.json", lambda m: m.update(commit=commit, date=f"2026-01-0{i + 1}T00:00:00+00:00"))
        assert regress.record_history(run, hist) == 4
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert len(lines) == 12
    assert set(lines[0]) >= {"commit", "date", "run_config_hash", "config_hash", "tau", "speedup", "method"}
    frame = regress.history_frame(hist)
    assert list(frame.drop_duplicates("commit").commit) == ["aaa1111", "bbb2222", "ccc3333"]
    assert set(frame.method) == {"pld", "eagle"}
    res = cli.invoke(app, ["history", "--file", str(hist), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "plots" / "history.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "history.svg").exists()
    res = cli.invoke(app, ["history", "--file", str(hist), "--benchmark", "nq"])
    assert res.exit_code == 2 and "no lines" in res.output


def test_history_without_file_is_one_line(tmp_path):
    with pytest.raises(SpecbenchError, match="compare --record"):
        regress.history_frame(tmp_path / "none.jsonl")
