"""A user's prompt file as a benchmark: naming, checks, loading, and keys tied to the file's bytes."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harness.core.errors import SpecbenchError
from harness.runs.benchmarks import load_questions, parse_benchmarks
from harness.runs.results import record_key
from tests.test_regress import edit_json

QUESTIONS = [
    {"question_id": 1, "category": "code", "turns": ["Write a loop."], "reference": ["ignored"]},
    {"question_id": 2, "category": "math", "turns": ["What is 2+2?", "And times 3?"]},
    {"question_id": 3, "category": "code", "turns": ["Sort a list."]},
]


def write_file(folder: Path, rows=QUESTIONS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_named_by_parent_folder_or_by_name_equals_path(tmp_path):
    path = write_file(tmp_path / "my_set")
    names, files = parse_benchmarks(["gsm8k", str(path), f"other={path}"])
    assert names == ["gsm8k", "my_set", "other"]
    assert set(files) == {"my_set", "other"}
    assert files["my_set"].sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert files["other"].as_config() == {"path": str(path), "sha256": files["my_set"].sha256}


def test_questions_of_a_file_with_one_or_several_turns(tmp_path):
    path = write_file(tmp_path / "my_set")
    _, files = parse_benchmarks([str(path)])
    qs = load_questions("my_set", None, files=files)
    assert [(q.question_id, q.category, len(q.turns)) for q in qs] == [(1, "code", 1), (2, "math", 2), (3, "code", 1)]
    assert all(q.benchmark == "my_set" for q in qs)
    assert [q.question_id for q in load_questions("my_set", None, limit=2, files=files)] == [1, 2]  # one per category


@pytest.mark.parametrize("make,needle", [
    (lambda p: "gsm9k", "did you mean 'gsm8k'"),
    (lambda p: str(p / "nope" / "question.jsonl"), "not found"),
    (lambda p: f"mt_bench={write_file(p / 'x')}", "a built-in benchmark"),
    (lambda p: f"bad name={write_file(p / 'x')}", "use letters, digits"),
])
def test_bad_specs_are_one_line(tmp_path, make, needle):
    with pytest.raises(SpecbenchError, match=needle):
        parse_benchmarks([make(tmp_path)])


def test_malformed_file_names_the_line(tmp_path):
    path = write_file(tmp_path / "broken")
    path.write_text(path.read_text() + '{"question_id": 4, "turns": \n')
    with pytest.raises(SpecbenchError, match=r"question\.jsonl:4: malformed JSON"):
        parse_benchmarks([str(path)])


def test_two_files_with_one_name_are_refused(tmp_path):
    a = write_file(tmp_path / "a" / "same")
    b = write_file(tmp_path / "b" / "same", QUESTIONS[:1])
    with pytest.raises(SpecbenchError, match="two prompt files are named 'same'"):
        parse_benchmarks([str(a), str(b)])


def test_a_changed_file_is_refused_and_keys_follow_the_bytes(tmp_path):
    path = write_file(tmp_path / "my_set")
    _, files = parse_benchmarks([str(path)])
    write_file(tmp_path / "my_set", QUESTIONS[:2])
    with pytest.raises(SpecbenchError, match="changed or vanished"):
        load_questions("my_set", None, files=files)
    rec = {"method": "pld", "config_hash": "c", "benchmark": "my_set", "question_id": 1, "turn": 0,
           "temperature": 0.0, "acceptance": "greedy", "seed": 0}
    old = record_key({**rec, "prompt_sha256": files["my_set"].sha256})
    new = record_key({**rec, "prompt_sha256": parse_benchmarks([str(path)])[1]["my_set"].sha256})
    assert old != new and old.startswith(f"pld|c|my_set@{files['my_set'].sha256[:12]}|1|0|")
    assert record_key(rec) == "pld|c|my_set|1|0|0.0|greedy|0"  # built-in benchmarks keep their keys


def test_a_prompt_file_with_several_categories_gets_a_category_table_and_plot(tmp_path):
    """Per-category Speedup and τ (Spec-Bench's table) for prompt files only; a run of built-in
    benchmarks writes no such table."""
    from harness.report.run_readme import write_report
    from tests.test_regress import edit_records
    from tests.test_report import write_run

    plain = write_run(tmp_path / "plain", methods=("pld", "eagle"), benchmarks=("mt_bench", "gsm8k"))
    assert not any(p.name.startswith("categories") for p in write_report(plain))
    run = write_run(tmp_path / "run", methods=("pld", "eagle"), benchmarks=("mt_bench", "gsm8k"))

    def as_file(rec):
        if rec["benchmark"] == "gsm8k":
            rec.update(benchmark="my_set", prompt_sha256="ab" * 32, category="even" if rec["question_id"] % 2 else "odd")
    edit_records(run, as_file)
    edit_json(run / "meta.json", lambda m: m["config"].update(benchmarks=["mt_bench", "my_set"]))
    names = {p.name for p in write_report(run)}
    assert {"categories.md", "categories.tex", "categories.csv", "categories.png", "categories.svg"} <= names
    md = (run / "tables" / "categories.md").read_text()
    assert "| Method | even Speedup | even τ | odd Speedup | odd τ | Mean Speedup | Mean τ |" in md
    import pandas as pd

    frame = pd.read_csv(run / "tables" / "categories.csv")
    assert set(frame.category) == {"my_set/even", "my_set/odd", "mean"} and set(frame.method) == {"pld", "eagle"}
    # each category's τ is that of its own answers
    from harness.runs.metrics import tau
    from harness.runs.results import RunDir

    recs = [r for r in RunDir(run).read_records() if r.method == "pld" and r.category == "odd"]
    got = frame[(frame.method == "pld") & (frame.category == "my_set/odd")].tau.item()
    assert got == pytest.approx(round(tau(recs), 4))
