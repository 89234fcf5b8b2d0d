"""Baselines, regress exit codes (0 / 1 / 2 naming the field) and the τ history, on synthetic runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from harness.core.errors import SpecbenchError
from harness.runs import history, regress
from tests.test_report import write_run

cli = CliRunner()


@pytest.fixture(autouse=True)
def real_history_untouched():
    """No test may append to the committed results/history.jsonl."""
    path = history.HISTORY_FILE
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


def records_of(run_dir: Path, cell: dict) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "records.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in lines if all(r[k] == cell[k] for k in ("method", "benchmark", "temperature", "acceptance"))]


def regress_cli(run_dir, baseline, *extra):
    return cli.invoke(app, ["regress", str(run_dir), "--baseline", str(baseline), *extra])


def test_baseline_holds_cells_and_provenance(baseline):
    data = json.loads(baseline.read_text())
    assert data["format"] == regress.FORMAT
    # 2 methods x 2 benchmarks x 2 temperatures; AR is not a cell.
    assert len(data["cells"]) == 8 and {c["method"] for c in data["cells"]} == {"pld", "eagle"}
    cell = data["cells"][0]
    assert set(cell) >= {"method", "benchmark", "temperature", "acceptance", "tau", "per_depth"}
    prov = data["provenance"]
    assert prov["target"] == "tiny" and prov["dtype"] == "float32" and prov["max_new_tokens"] == 40
    assert prov["checkpoints"] == {"pld": None, "eagle": "ck-eagle"}
    assert prov["prompts"]["mt_bench"]["questions"] == [100, 101, 102, 103]


def test_baseline_pools_steps_over_the_cells_answers(run_dir, tmp_path):
    """per_depth[d-1] is the share of the cell's verify steps that accepted at least d drafts and τ
    the tokens per step, both pooled over its answers. Its four answers, made by hand: two of one
    step accepting 3 drafts, two of three steps accepting 0, 0, 1 -> 8 steps, 4 accepting >= 1, 2
    accepting >= 2 and >= 3, 16 tokens: depths 0.5, 0.25, 0.25 and τ 2.0 (the answers' mean τ would
    be (4 + 4/3) / 2, their mean depth-1 share 2/3)."""
    cell = {"method": "pld", "benchmark": "gsm8k", "temperature": 0.0, "acceptance": "greedy"}
    answers = iter([[3], [0, 0, 1]] * 2)

    def hand_made(rec):
        if all(rec[k] == v for k, v in cell.items()):
            accepted = next(answers)
            n = len(accepted)
            rec["steps"] = {"tree_size": [4] * n, "accepted": accepted, "tokens": [a + 1 for a in accepted],
                            "draft_ms": [1.0] * n, "verify_ms": [10.0] * n}
            # the answer as long as its steps (and the prefill's first token) make it: records must agree
            rec["new_tokens"] = sum(accepted) + n + 1
            rec["output_ids"] = [7] * rec["new_tokens"]
    edit_records(run_dir, hand_made)
    assert len(records_of(run_dir, cell)) == 4
    path = tmp_path / "hand.json"
    assert cli.invoke(app, ["baseline", str(run_dir), "--save", str(path)]).exit_code == 0
    got = next(c for c in json.loads(path.read_text())["cells"] if all(c[k] == v for k, v in cell.items()))
    assert got["per_depth"] == [0.5, 0.25, 0.25] and got["tau"] == 2.0


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
    base = tmp_path / "small.json"
    regress.save_baseline(run_dir, base, methods=["pld"])
    data = json.loads(base.read_text())
    assert {c["method"] for c in data["cells"]} == {"pld"} and data["provenance"]["checkpoints"] == {"pld": None}
    assert regress.check(run_dir, base).exit_code == 0


# ----------------------------------------------------------------------------- per-depth gate

def cell_of(data: dict, method: str, benchmark: str, temperature: float = 0.0) -> dict:
    return next(c for c in data["cells"] if (c["method"], c["benchmark"], c["temperature"]) ==
                (method, benchmark, temperature))


def test_a_depth_drop_fails_with_level_tau_and_names_the_depth(run_dir, baseline):
    """τ is unchanged, but depth 2's acceptance is 10% under the baseline's: the gate fails and
    says which method, benchmark and depth moved, and by how much."""
    edit_json(baseline, lambda d: cell_of(d, "eagle", "gsm8k")["per_depth"].__setitem__(
        1, cell_of(d, "eagle", "gsm8k")["per_depth"][1] * 1.10))
    res = regress_cli(run_dir, baseline)
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert "regressed: eagle gsm8k T=0 greedy: depth 2 acceptance" in text and "(-9.1%)" in text
    assert "τ " not in text.split("regressed:")[1]  # τ itself did not move
    assert "1 of 8 cells failed" in text
    # its own tolerance: 10% per depth passes while τ keeps 2%
    assert regress_cli(run_dir, baseline, "--depth-tolerance", "0.1").exit_code == 0
    assert regress_cli(run_dir, baseline, "--tolerance", "0.1", "--depth-tolerance", "0.05").exit_code == 1


def test_a_depth_the_run_never_reached_counts_zero(run_dir, baseline):
    edit_json(baseline, lambda d: cell_of(d, "pld", "mt_bench")["per_depth"].append(0.05))
    verdict = regress.check(run_dir, baseline)
    row = verdict.failed[0]
    depth = len(cell_of(json.loads(baseline.read_text()), "pld", "mt_bench")["per_depth"])
    assert len(verdict.failed) == 1 and row["depths"] == [
        {"depth": depth, "baseline": 0.05, "run": 0.0, "change": -1.0, "status": "dropped"}]
    assert regress.describe_moves(row) == [f"depth {depth} acceptance 0.0500 -> 0.0000 (-100.0%)"]


def test_zero_baseline_depths_are_not_gated_and_rises_are_improvements(run_dir, baseline):
    def edit(d):
        cell_of(d, "pld", "gsm8k")["per_depth"][0] *= 0.5       # the run is 2x the baseline here
        cell_of(d, "eagle", "mt_bench")["per_depth"][-1] = 0.0  # no relative change from 0
    edit_json(baseline, edit)
    verdict = regress.check(run_dir, baseline)
    assert verdict.exit_code == 0
    improved = [r for r in verdict.rows if r["status"] == "improved"]
    assert [(r["method"], r["benchmark"], [m["depth"] for m in r["depths"]]) for r in improved] == [
        ("pld", "gsm8k", [1])]
    assert improved[0]["depths"][0]["change"] == pytest.approx(1.0, abs=1e-4)


def test_depth_tolerance_is_checked_and_written_to_the_report(run_dir, baseline, tmp_path):
    res = regress_cli(run_dir, baseline, "--depth-tolerance", "2")
    assert res.exit_code == 2 and "--depth-tolerance" in res.output
    edit_json(baseline, lambda d: cell_of(d, "pld", "gsm8k")["per_depth"].__setitem__(0, 0.99))
    assert regress_cli(run_dir, baseline, "--depth-tolerance", "0.3", "--report", str(tmp_path / "v.json")).exit_code == 1
    report = json.loads((tmp_path / "v.json").read_text())
    assert report["depth_tolerance"] == 0.3 and report["tolerance"] == 0.02
    failed = [c for c in report["cells"] if c["status"] == "dropped"]
    assert [(c["method"], c["benchmark"], c["tau_status"], [m["depth"] for m in c["depths"]]) for c in failed] == [
        ("pld", "gsm8k", "ok", [1])]


# ----------------------------------------------------------------------------- methods outside the registry

EXTERNAL = "my_pkg.ngram:NgramDrafter"


def test_a_baseline_can_be_made_for_an_external_method(tmp_path, monkeypatch):
    """Cells are keyed by the names the records carry: a `module:Class` method the static
    registry does not know is baselined and gated like a built-in one; --methods also takes a
    name that methods.registry.get_method resolves to a class whose `name` the records carry."""
    run = write_run(tmp_path / "run", methods=("pld", EXTERNAL))
    base = tmp_path / "ext.json"
    res = cli.invoke(app, ["baseline", str(run), "--save", str(base), "--methods", EXTERNAL])
    assert res.exit_code == 0, res.output
    data = json.loads(base.read_text())
    assert {c["method"] for c in data["cells"]} == {EXTERNAL} and len(data["cells"]) == 2
    assert regress_cli(run, base).exit_code == 0
    edit_json(base, lambda d: d["cells"][0].update(tau=d["cells"][0]["tau"] * 1.5))
    res = regress_cli(run, base)
    assert res.exit_code == 1 and f"regressed: {EXTERNAL} mt_bench T=0 greedy: τ" in " ".join(res.output.split())

    import methods.registry

    def get_method(name: str) -> type:
        if name == "ngram":
            return type("Ngram", (), {"name": EXTERNAL})
        raise SpecbenchError(f"unknown method {name!r}")
    monkeypatch.setattr(methods.registry, "get_method", get_method)
    regress.save_baseline(run, tmp_path / "alias.json", methods=["ngram"])
    assert {c["method"] for c in json.loads((tmp_path / "alias.json").read_text())["cells"]} == {EXTERNAL}
    res = cli.invoke(app, ["baseline", str(run), "--save", str(tmp_path / "x.json"), "--methods", "eagle"])
    assert res.exit_code == 2 and f"has no cells of method 'eagle'; it holds {EXTERNAL}, pld" in " ".join(res.output.split())


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
        history.record_history(run_dir, tmp_path / "h.jsonl")
    edit_json(run_dir / "meta.json", lambda m: m.update(dirty=False, resumed_at=[{"commit": "x", "dirty": True}]))
    assert cli.invoke(app, ["baseline", str(run_dir), "--save", str(tmp_path / "b.json")]).exit_code == 2
    res = cli.invoke(app, ["baseline", str(run_dir), "--save", str(tmp_path / "b.json"), "--allow-dirty"])
    assert res.exit_code == 0, res.output
    source = json.loads((tmp_path / "b.json").read_text())["source"]["run_dir"]
    assert source == "<outside the repository>/" + "/".join(run_dir.parts[-2:])
    inside = history.REPO_ROOT / "results" / "runs" / "x"
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
        assert history.record_history(run, hist) == 4
    lines = [json.loads(x) for x in hist.read_text().splitlines()]
    assert len(lines) == 12
    assert set(lines[0]) >= {"commit", "date", "run_config_hash", "config_hash", "tau", "speedup", "method",
                             "depth1", "cpu_kind", "prompts"}
    cells = {(c["method"], c["benchmark"]): c for c in regress.run_cells(regress.load_run(tmp_path / "r2"))}
    assert [x["depth1"] for x in lines[8:]] == [cells[x["method"], x["benchmark"]]["per_depth"][0] for x in lines[8:]]
    cpu = json.loads((tmp_path / "r0" / "meta.json").read_text()).get("cpu_model") or "unknown CPU"
    assert lines[0]["cpu_kind"] == f"{cpu} (AVX-512, no bf16 kernels)"  # the run's flags: write_run's
    frame = history.history_frame(hist)
    assert list(frame.drop_duplicates("commit").commit) == ["aaa1111", "bbb2222", "ccc3333"]
    assert set(frame.method) == {"pld", "eagle"}
    res = cli.invoke(app, ["history", "--file", str(hist), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "plots" / "history.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "history.svg").exists()
    res = cli.invoke(app, ["history", "--file", str(hist), "--benchmark", "nq"])
    assert res.exit_code == 2 and "no lines" in res.output


def history_line(commit: str, day: int, method: str, tau: float, depth1: float, **extra) -> dict:
    return {"commit": commit, "dirty": False, "date": f"2026-01-{day:02d}T00:00:00+00:00", "target": "tiny",
            "dtype": "float32", "device": "cpu", "max_new_tokens": 32, "method": method, "benchmark": "mt_bench",
            "temperature": 0.0, "acceptance": "greedy", "lossy": False, "tau": tau, "depth1": depth1, **extra}


def test_history_marks_the_commits_where_a_method_moved(tmp_path):
    """Each method is compared with its own previous commit in the file (a method absent at a
    commit is skipped over); skipped-commit notes and other settings' lines are left out."""
    hist = tmp_path / "history.jsonl"
    lines = [
        history_line("c1", 1, "pld", 1.50, 0.30), history_line("c1", 1, "eagle", 2.00, 0.60),
        history_line("c2", 2, "pld", 1.51, 0.30),                                  # +0.7%: within 2%
        {"commit": "c3", "date": "2026-01-03T00:00:00+00:00", "source": "backfill", "skipped": "no cli.py"},
        history_line("c4", 4, "pld", 1.20, 0.30), history_line("c4", 4, "eagle", 2.00, 0.66),
        history_line("c4", 4, "pld", 9.0, 0.9, max_new_tokens=128),               # another grid
    ]
    hist.write_text("".join(json.dumps(x) + "\n" for x in lines))
    frame = history.history_frame(hist, max_new_tokens=32)
    assert list(frame.drop_duplicates("commit").commit) == ["c1", "c2", "c4"]
    moved = frame[frame.tau_moved | frame.depth1_moved][["commit", "method", "tau_moved", "depth1_moved"]]
    assert moved.values.tolist() == [["c4", "pld", True, False], ["c4", "eagle", False, True]]  # table order
    eagle, pld = (history.row_label(m, "greedy", False) for m in ("eagle", "pld"))  # as tables name them
    assert history.history_moves(frame) == [f"c4 {pld}: τ 1.5100 -> 1.2000 (-20.5%)",
                                            f"c4 {eagle}: depth 1 0.600 -> 0.660 (+10.0%)"]
    assert not history.history_frame(hist, max_new_tokens=32, tolerance=0.25).tau_moved.any()
    res = cli.invoke(app, ["history", "--file", str(hist), "--max-new-tokens", "32", "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert f"c4 {pld}: τ 1.5100 -> 1.2000 (-20.5%)" in res.output and "*1.2000 (0.300)" in res.output
    assert (tmp_path / "p" / "history.png").stat().st_size > 1000


def test_history_without_file_is_one_line(tmp_path):
    with pytest.raises(SpecbenchError, match="compare --record"):
        history.history_frame(tmp_path / "none.jsonl")
