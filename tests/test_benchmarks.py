"""Benchmark manifest, loader, stratified --limit, errors and offline fetch (no models, no network)."""
from __future__ import annotations

import io
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.core.errors import SpecbenchError
from harness.runs import benchmarks as B

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def _copy(shared_data: Path, tmp_path: Path, name: str) -> Path:
    """A writable copy of one benchmark file under tmp_path/<dir>/question.jsonl."""
    entry = B.BENCHMARKS[name]
    dst = tmp_path / entry["dir"] / entry["file"]
    dst.parent.mkdir(parents=True)
    shutil.copyfile(shared_data / entry["dir"] / entry["file"], dst)
    return dst


def _local_opener(shared_data: Path, alter: bool = False):
    """An opener that serves the local files for the manifest URLs (optionally corrupted)."""
    by_url = {e["url"]: shared_data / e["dir"] / e["file"] for e in B.BENCHMARKS.values()}
    calls: list[str] = []

    def opener(url: str) -> io.BytesIO:
        calls.append(url)
        data = by_url[url].read_bytes()
        return io.BytesIO(data.replace(b"a", b"b", 1) if alter else data)

    opener.calls = calls  # type: ignore[attr-defined]
    return opener


# --- manifest ---------------------------------------------------------------------------------------------

def test_manifest_matches_shared_sums(shared_data: Path) -> None:
    assert B.benchmark_names() == ["mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq"]
    sums = dict(reversed(line.split()) for line in (shared_data / "SHA256SUMS").read_text().splitlines())
    eagle = {"mt_bench": "mt_bench", "humaneval": "humaneval", "gsm8k": "gsm8k", "alpaca": "alpaca",
             "cnn_dm": "sum", "nq": "qa"}
    for name, e in B.BENCHMARKS.items():
        assert e["dir"] == name and e["file"] == "question.jsonl" and e["records"] == 80
        assert e["eagle_name"] == eagle[name]
        assert e["url"] == ("https://raw.githubusercontent.com/SafeAILab/EAGLE/cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b"
                            f"/eagle/data/{eagle[name]}/question.jsonl")
        assert e["sha256"] == sums[f"{name}/question.jsonl"]
        assert e["turns"] == (2 if name == "mt_bench" else 1)
    assert [e["title"] for e in B.BENCHMARKS.values()] == ["MT-Bench", "HumanEval", "GSM8K", "Alpaca", "CNN/DM", "NQ"]
    assert not (B.MANIFEST_PATH.parent / "__init__.py").exists()  # datasets/ is data, not a package


# --- loading ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mt_bench", "humaneval", "gsm8k", "alpaca", "cnn_dm", "nq"])
def test_all_six_load(shared_data: Path, name: str) -> None:
    qs = B.load_questions(name, shared_data)
    assert len(qs) == B.BENCHMARKS[name]["records"] == 80
    assert all(isinstance(q, B.Question) and q.benchmark == name for q in qs)
    assert all(len(q.turns) == B.BENCHMARKS[name]["turns"] and all(q.turns) for q in qs)
    assert len({q.question_id for q in qs}) == 80


@pytest.mark.parametrize("name", ["cnn_dm", "nq"])
def test_files_without_final_newline(shared_data: Path, name: str) -> None:
    raw = (shared_data / name / "question.jsonl").read_bytes()
    assert not raw.endswith(b"\n") and raw.count(b"\n") == 79  # the quirk is really there
    qs = B.load_questions(name, shared_data)
    assert len(qs) == 80 and qs[-1].question_id == (320 if name == "cnn_dm" else 400)


def test_mt_bench_fields(shared_data: Path) -> None:
    qs = B.load_questions("mt_bench", shared_data)
    assert qs[0].question_id == 81 and qs[0].category == "writing" and len(qs[0].turns) == 2
    assert isinstance(qs[0].turns, tuple)
    assert [q.question_id for q in qs] == list(range(81, 161))
    assert {q.category for q in B.load_questions("alpaca", shared_data)} == {""}


def test_limit_is_stratified_and_deterministic(shared_data: Path) -> None:
    qs = B.load_questions("mt_bench", shared_data, limit=8)
    assert [q.category for q in qs] == CATEGORIES  # one per category, in file order
    assert [q.question_id for q in qs] == [81, 91, 101, 111, 121, 131, 141, 151]  # first of each category
    assert B.load_questions("mt_bench", shared_data, limit=8) == qs

    ten = B.load_questions("mt_bench", shared_data, limit=10)
    first_ten = B.load_questions("mt_bench", shared_data)[:10]
    assert ten != first_ten and {q.category for q in first_ten} == {"writing"}
    assert [q.question_id for q in ten] == [81, 82, 91, 92, 101, 111, 121, 131, 141, 151]
    assert [q.question_id for q in ten] == sorted(q.question_id for q in ten)  # stable file order

    assert len(B.load_questions("mt_bench", shared_data, limit=80)) == 80
    assert len(B.load_questions("mt_bench", shared_data, limit=1000)) == 80
    assert [q.question_id for q in B.load_questions("gsm8k", shared_data, limit=3)] == \
        [q.question_id for q in B.load_questions("gsm8k", shared_data)[:3]]  # one category: file order


def test_ids_selection(shared_data: Path) -> None:
    qs = B.load_questions("mt_bench", shared_data, ids=[160, 81, 100, 81])
    assert [q.question_id for q in qs] == [81, 100, 160]  # file order, duplicates ignored
    both = B.load_questions("mt_bench", shared_data, ids=[81, 82, 91, 92], limit=2)
    assert [q.question_id for q in both] == [81, 91]  # limit stratifies within the selection
    with pytest.raises(SpecbenchError, match=r"unknown question id\(s\) 5, 999 for mt_bench; valid ids are 81\.\.160"):
        B.load_questions("mt_bench", shared_data, ids=[81, 5, 999])


def test_env_var_fallback_and_option_wins(shared_data: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(B.DATA_ENV, str(shared_data))
    assert len(B.load_questions("nq")) == 80
    assert B.resolve_data_dir(None) == shared_data
    assert B.resolve_data_dir(tmp_path) == tmp_path  # the option beats the env var
    monkeypatch.setenv(B.DATA_ENV, str(tmp_path / "nope"))
    with pytest.raises(SpecbenchError, match=r"nope.*\$SPECBENCH_DATA.*does not exist"):
        B.load_questions("nq")


# --- errors -----------------------------------------------------------------------------------------------

def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_unknown_benchmark(shared_data: Path) -> None:
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("mtbench", shared_data)
    assert "unknown benchmark 'mtbench' (did you mean 'mt_bench'?)" in _one_line(exc)
    with pytest.raises(SpecbenchError, match="EAGLE's folder name; here it is called 'cnn_dm'"):
        B.load_questions("sum", shared_data)
    with pytest.raises(SpecbenchError, match="did you mean 'gsm8k'"):
        B.fetch_data(Path("unused"), ["gsm8"])


def test_missing_data_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(B.DATA_ENV, raising=False)
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("mt_bench")
    assert _one_line(exc).startswith("no benchmark data dir: pass --data-dir DIR or set SPECBENCH_DATA")
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("mt_bench", tmp_path / "absent")
    assert "absent" in _one_line(exc) and "--data-dir" in str(exc.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("humaneval", tmp_path)
    msg = _one_line(exc)
    assert str(tmp_path / "humaneval" / "question.jsonl") in msg and "fetch-data" in msg


def test_malformed_line_number(shared_data: Path, tmp_path: Path) -> None:
    path = _copy(shared_data, tmp_path, "nq")
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[41] = lines[41][:-5]  # truncate the 42nd line
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("nq", tmp_path)
    assert _one_line(exc).startswith(f"{path}:42: malformed JSON (")


def test_blank_lines_keep_line_numbers(shared_data: Path, tmp_path: Path) -> None:
    path = _copy(shared_data, tmp_path, "gsm8k")
    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(lines[:3] + ["", "  "] + lines[3:5] + ["{oops"] + lines[5:]), encoding="utf-8")
    with pytest.raises(SpecbenchError, match=r":8: malformed JSON"):
        B.load_questions("gsm8k", tmp_path)


@pytest.mark.parametrize("record, fragment", [
    ({"question_id": 1, "category": "x", "turns": ["ok", ""]}, "empty or non-string turn 2"),
    ({"question_id": 1, "category": "x", "turns": ["   "]}, "empty or non-string turn 1"),
    ({"question_id": 1, "turns": []}, "non-empty list 'turns'"),
    ({"category": "x", "turns": ["hi"]}, "integer 'question_id'"),
    ({"question_id": 1}, "non-empty list 'turns'"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_records(tmp_path: Path, record, fragment: str) -> None:
    path = tmp_path / "alpaca" / "question.jsonl"
    path.parent.mkdir()
    good = json.dumps({"question_id": 0, "turns": ["fine"]})
    path.write_text(good + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("alpaca", tmp_path)
    msg = _one_line(exc)
    assert msg.startswith(f"{path}:2: ") and fragment in msg


def test_category_defaults_to_empty(tmp_path: Path) -> None:
    path = tmp_path / "nq" / "question.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"question_id": 7, "turns": ["q?"]}), encoding="utf-8")
    assert B.load_questions("nq", tmp_path) == [B.Question("nq", 7, "", ("q?",))]


@pytest.mark.parametrize("limit", [0, -3])
def test_bad_limit(shared_data: Path, limit: int) -> None:
    with pytest.raises(SpecbenchError) as exc:
        B.load_questions("mt_bench", shared_data, limit=limit)
    assert "--limit must be a positive number" in _one_line(exc)


# --- fetch / verify ---------------------------------------------------------------------------------------

def test_fetch_offline_writes_verified_files(shared_data: Path, tmp_path: Path) -> None:
    dest = tmp_path / "data"
    opener = _local_opener(shared_data)
    paths = B.fetch_data(dest, opener=opener)
    assert paths == [dest / n / "question.jsonl" for n in B.benchmark_names()]
    assert all(p.read_bytes() == (shared_data / p.parent.name / p.name).read_bytes() for p in paths)
    assert B.verify_data_dir(dest) == {n: True for n in B.benchmark_names()}
    assert len(B.load_questions("cnn_dm", dest)) == 80
    assert not list(dest.rglob("*.part"))

    B.fetch_data(dest, opener=opener)  # all present and valid: nothing downloaded again
    assert len(opener.calls) == 6
    B.fetch_data(dest, ["nq"], opener=opener, force=True)
    assert len(opener.calls) == 7


def test_fetch_file_url_via_urlopen(shared_data: Path, tmp_path: Path) -> None:
    # urlopen handles file:// itself; redirect the manifest URL to the local copy.
    local = {e["url"]: (shared_data / e["dir"] / e["file"]).as_uri() for e in B.BENCHMARKS.values()}
    B.fetch_data(tmp_path, ["nq"], opener=lambda url: urllib.request.urlopen(local[url]))
    assert B.verify_data_dir(tmp_path) == {"nq": True}


def test_fetch_corrupted_download_leaves_nothing(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecbenchError) as exc:
        B.fetch_data(tmp_path, ["mt_bench"], opener=_local_opener(shared_data, alter=True))
    assert "checksum mismatch for mt_bench" in _one_line(exc)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_fetch_replaces_a_bad_local_file(shared_data: Path, tmp_path: Path) -> None:
    path = _copy(shared_data, tmp_path, "gsm8k")
    path.write_bytes(path.read_bytes() + b"\n")
    assert B.verify_data_dir(tmp_path) == {"gsm8k": False}
    B.fetch_data(tmp_path, ["gsm8k"], opener=_local_opener(shared_data))
    assert B.verify_data_dir(tmp_path) == {"gsm8k": True}


def test_fetch_network_error_is_one_line(tmp_path: Path) -> None:
    def offline(url: str):
        raise urllib.error.URLError("no route to host")

    with pytest.raises(SpecbenchError) as exc:
        B.fetch_data(tmp_path, ["nq"], opener=offline)
    assert "could not download nq" in _one_line(exc)
    assert not list(tmp_path.rglob("*.jsonl"))


def test_verify_shared_data(shared_data: Path) -> None:
    assert B.verify_data_dir(shared_data) == {n: True for n in B.benchmark_names()}
