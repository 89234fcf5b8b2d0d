"""The typed answer record: committed records.jsonl files load through `Record.from_dict`, a line
written today reads back to the same bytes, old lines get the defaults older code used, and a
committed reference folder's tables rebuild from its records to the committed bytes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.core.errors import SpecbenchError
from harness.report.run_readme import write_report
from harness.runs.metrics import attach_divergences, write_summary
from harness.runs.record import SCHEMA_VERSION, Record, Steps, record_key
from harness.runs.results import RunDir

REPO = Path(__file__).resolve().parent.parent
QWEN_FP32 = REPO / "results" / "reference" / "qwen2.5-coder-1.5b" / "fp32"


def test_a_committed_records_file_loads_with_its_exact_values():
    records = RunDir(QWEN_FP32).read_records()
    assert len(records) == 32
    assert [(r.method, r.question_id) for r in records[:4]] == [("ar", 0), ("pld", 0), ("sps", 0), ("eagle2", 0)]
    eagle2 = records[3]
    assert eagle2.key == "eagle2|36c20a94ab52|humaneval|0|0|0.0|greedy|807940140"
    assert (eagle2.config_hash, eagle2.checkpoint_hash, eagle2.dtype) == ("36c20a94ab52", "79597419eead", "float32")
    assert eagle2.method_config["layer_config"] == {"intermediate_size": 1536}
    assert (eagle2.new_tokens, eagle2.wall_s, eagle2.prefill_s) == (64, 61.648374, 2.570865)
    assert (sum(eagle2.steps.tokens), len(eagle2.steps.tokens), eagle2.steps.tree_size[0]) == (63, 38, 31)
    assert eagle2.steps.accepted[:4] == [1, 1, 0, 0]
    assert eagle2.schema == 1 and eagle2.lossy is False and eagle2.other_cpu_cores is None
    assert records[0].is_ar and records[0].acceptance == "none"
    assert records[0].prompt == eagle2.prompt == ("humaneval", 0, 0, 0.0, 1.0, 807940140)


def test_every_committed_line_reads_back_to_its_bytes():
    """A line of any committed file, read and written again, is the same line (plus `schema` for
    lines written before the field existed): the typed record changes no runner's line."""
    files = sorted((REPO / "results").rglob("records.jsonl"))
    assert files
    for file in files:
        for line in file.read_text().splitlines():
            data = json.loads(line)
            out = Record.from_dict(data).to_json_dict()
            if "schema" not in data:
                assert out.pop("schema") == 1
            assert json.dumps(out, separators=(",", ":")) == line, file


def test_an_old_line_gets_the_defaults_older_code_used():
    line = json.loads((QWEN_FP32 / "records.jsonl").read_text().splitlines()[0])  # AR
    for newer in ("lossy", "top_p", "category", "device", "prefill_s", "first_token_from_prefill", "steps", "key"):
        del line[newer]
    rec = Record.from_dict({**line, "acceptance": "typical"})
    assert rec.lossy is True  # typical was the one lossy rule before the runner wrote `lossy`
    assert (rec.top_p, rec.category, rec.device, rec.prefill_s, rec.first_token_from_prefill) == (1.0, "", "cpu", 0.0,
                                                                                                   False)
    assert rec.steps == Steps() and rec.steps.tokens is None
    assert rec.key == record_key(line | {"acceptance": "typical"}) == "ar|4ca9654bbebb|humaneval|0|0|0.0|typical|807940140"
    assert Record.from_dict(line).lossy is False


def test_unknown_keys_are_kept_and_written_back_last():
    line = json.loads((QWEN_FP32 / "records.jsonl").read_text().splitlines()[1])
    rec = Record.from_dict({**line, "energy_j": 1.5, "steps": {**line["steps"], "power_w": [3.0]}})
    assert rec.extra == {"energy_j": 1.5} and rec.steps.extra == {"power_w": [3.0]}
    out = rec.to_json_dict()
    assert list(out)[-1] == "energy_j" and list(out["steps"])[-1] == "power_w"


def test_a_new_record_leads_with_its_schema_and_omits_unset_fields():
    rec = Record(method="pld", benchmark="mt_bench", question_id=81, turn=1, temperature=0, acceptance="greedy", seed=3)
    out = rec.to_json_dict()
    assert list(out)[:2] == ["schema", "method"] and out["schema"] == SCHEMA_VERSION
    assert not {"prompt_sha256", "ar_top1", "ar_gap", "other_cpu_cores", "divergence"} & set(out)
    assert rec.key == out["key"] == "pld|44136fa355b3|mt_bench|81|1|0.0|greedy|3"  # hash of {}
    assert Record.from_dict(out) == rec


def test_a_line_without_its_key_fields_is_refused():
    with pytest.raises(SpecbenchError, match="lacks turn, acceptance"):
        Record.from_dict({"method": "pld", "benchmark": "b", "question_id": 1, "temperature": 0.0, "seed": 0})


def test_a_committed_reference_folder_rebuilds_to_its_committed_bytes(tmp_path):
    """summary.csv and `cli.py table` (write_report without plots: the README links the committed
    ones), rebuilt from the records alone, equal the committed files byte for byte; the README
    differs only in the folder's path."""
    rel = Path("results/reference/smollm2-135m/compiled-fp32-exactness")
    committed = REPO / rel
    copy = tmp_path / rel
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("tables", "summary.csv", "README.md"))
    write_summary(attach_divergences(RunDir(copy).read_records()), copy / "summary.csv")
    write_report(copy, plots=False)
    names = sorted(p.name for p in (committed / "tables").iterdir())
    assert names == sorted(p.name for p in (copy / "tables").iterdir()) and "main.md" in names
    for name in names:
        assert (copy / "tables" / name).read_bytes() == (committed / "tables" / name).read_bytes(), name
    assert (copy / "summary.csv").read_bytes() == (committed / "summary.csv").read_bytes()
    readme = (copy / "README.md").read_text().replace(str(copy), str(rel))
    assert readme == (committed / "README.md").read_text()
