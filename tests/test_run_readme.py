"""A run folder's generated README: the command rebuilt from meta.json parses back to the stored
config, and the provenance and contents it states are the folder's."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import typer.main

from cli import app
from harness.report.run_readme import README, _value, command_line, write_report, write_run_readme
from harness.runs.compare import parse_values
from harness.runs.config import RunConfig
from harness.runs.settings import parse_settings
from tests.test_regress import edit_json
from tests.test_report import write_run

COMMANDS = typer.main.get_command(app).commands


def parse(command: str) -> tuple[str, dict]:
    """The CLI command and its parsed options, as Typer would hand them to the command (not run)."""
    words = shlex.split(command)
    assert words[:2] == ["python", "cli.py"]
    name, args = words[2], words[3:]
    return name, COMMANDS[name].make_context(name, args).params


@pytest.mark.parametrize("value", ["auto", 16, 0.5, True, None, [1, 2], "a,b", "[x", {"k": 1}])
def test_values_parse_back_as_set_and_ablate_read_them(value):
    assert parse_settings([f"k={_value(value)}"]) == {"k": value}
    assert parse_values(_value(value)) == [value]


def mark_compare_meta(run_dir: Path) -> None:
    def edit(meta):
        meta["config"].update(settings={"tree_budget": 16, "pld.max_draft": 5}, typical=["eagle"])
        meta.update(dirty=True, commit="abc123", cpu_kind="Test CPU (AVX512)", torch_threads=2, logical_cores=2,
                    python="3.11.7", packages={"torch": "2.13.0+cpu", "transformers": "5.25.0"},
                    target_runtime="eager", runs=["2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"])
    edit_json(run_dir / "meta.json", edit)


def test_a_fresh_folder_is_not_called_resumed(tmp_path):
    """A first start is stamped in `runs` a moment before meta.json's `date`: only later starts are resumes."""
    run_dir = write_run(tmp_path / "fresh", methods=("pld",), temperatures=(0.0,))
    edit_json(run_dir / "meta.json", lambda m: m.update(date="2026-01-01T00:00:01+00:00",
                                                        runs=["2026-01-01T00:00:00+00:00"]))
    write_report(run_dir, plots=False)
    date = next(line for line in (run_dir / README).read_text().splitlines() if line.startswith("| Date"))
    assert date == "| Date | 2026-01-01T00:00:01+00:00 |"


def test_compare_folder_readme_states_command_provenance_and_contents(tmp_path):
    run_dir = write_run(tmp_path / "grid", methods=("pld", "eagle"), temperatures=(0.0, 1.0), typical=True)
    mark_compare_meta(run_dir)
    paths = write_report(run_dir, plots=False)
    assert paths[-1] == run_dir / README
    text = (run_dir / README).read_text()
    command = next(line for line in text.splitlines() if line.startswith("python cli.py"))
    assert command == ("python cli.py compare --methods pld,eagle --benchmarks mt_bench,gsm8k --temperature 0 "
                       "--temperature 1 --target tiny --dtype float32 --device cpu --limit 4 --max-new-tokens 40 "
                       f"--tree-budget 16 --set pld.max_draft=5 --typical eagle --out {shlex.quote(str(run_dir))}")
    name, params = parse(command)
    assert name == "compare" and params["methods"] == "pld,eagle" and params["temperature"] == [0.0, 1.0]
    assert (params["limit"], params["max_new_tokens"], params["tree_budget"]) == (4, 40, "16")
    assert params["set_"] == ["pld.max_draft=5"] and params["typical"] == "eagle" and params["out"] == run_dir
    for needle in ("| Commit | `abc123`, **dirty**", "resumed 1x, last 2026-01-02T00:00:00+00:00",
                   "| Machine | Test CPU (AVX512), 2 threads, 2 logical cores |",
                   "torch 2.13.0+cpu, transformers 5.25.0, target runtime eager",
                   "| Target | tiny (float32) |", "| Methods | Prompt lookup, EAGLE (beside AR, the baseline) |",
                   "| Temperatures | 0, 1 |", "| Acceptance | T=0: greedy; T=1: lossless, typical (lossy) |",
                   "mt_bench, gsm8k: 4 questions, 4 answers per table row; up to 40 new tokens per answer |",
                   "--tree-budget 16 (every tree method)", "- [tables/main.md](tables/main.md)",
                   "[summary.csv](summary.csv)" if (run_dir / "summary.csv").exists() else "[meta.json](meta.json)"):
        assert needle in text, needle
    assert "plots/" not in text  # no plots written yet
    assert (run_dir / "tables" / "main.md").read_text().strip() in text
    write_report(run_dir)
    again = (run_dir / README).read_text()
    assert "- [plots/tau.png](plots/tau.png)" in again
    assert write_run_readme(run_dir).read_text() == again  # a pure function of the folder


def test_a_clean_run_says_so_and_an_unfinished_row_is_named(tmp_path):
    run_dir = write_run(tmp_path / "r", methods=("pld", "eagle"), benchmarks=("gsm8k",), questions=3)
    lines = (run_dir / "records.jsonl").read_text().splitlines(keepends=True)
    last_pld = max(i for i, line in enumerate(lines) if json.loads(line)["method"] == "pld")
    (run_dir / "records.jsonl").write_text("".join(lines[:last_pld] + lines[last_pld + 1:]))
    text = write_run_readme(run_dir).read_text()
    assert "| Commit | `abc123` (clean tree) |" in text
    assert "| Answers | gsm8k: 3 questions, 3 answers per table row; up to 40 new tokens per answer; " \
           "fewer answers: Prompt lookup on gsm8k (2) |" in text
    assert "[tables/" not in text and "- [records.jsonl](records.jsonl), [meta.json](meta.json)" in text


def test_ablation_folder_command(tmp_path):
    variants = {"default": ("pld", {"max_draft": 10}), "max_draft=5": ("pld", {"max_draft": 5}),
                "max_draft=2": ("pld", {"max_draft": 2})}
    ablation = {"method": "pld", "sweep": {"max_draft": [10, 5, 2]}, "fixed": {"adaptive": False}, "grid": False,
                "base_config": {"max_draft": 10, "adaptive": False},
                "variants": {"default": {}, "max_draft=5": {"max_draft": 5}, "max_draft=2": {"max_draft": 2}}}
    run_dir = write_run(tmp_path / "ab", variants=variants, ablation=ablation, benchmarks=("mt_bench",))
    edit_json(run_dir / "meta.json", lambda m: m["config"].update(command="ablate", methods=["pld"]))
    text = write_run_readme(run_dir).read_text()
    command = next(line for line in text.splitlines() if line.startswith("python cli.py"))
    assert command == ("python cli.py ablate pld --set max_draft=10,5,2 --set adaptive=false --benchmarks mt_bench "
                       "--temperature 0 --target tiny --dtype float32 --device cpu --limit 4 --max-new-tokens 40 "
                       f"--out {shlex.quote(str(run_dir))}")
    name, params = parse(command)
    assert name == "ablate" and params["method"] == "pld" and params["set_"] == ["max_draft=10,5,2", "adaptive=false"]
    assert ("| Ablation | pld: max_draft over 10, 5, 2 (one factor at a time around the defaults); fixed "
            "adaptive=False; variants: default, max_draft=5, max_draft=2 |") in text


def test_run_command_from_a_run_config():
    """`cli.py run` stores a RunConfig (one temperature, no `command`); prompt files come back as NAME=PATH."""
    cfg = RunConfig(methods=["pld", "eagle"], benchmarks=["mt_bench", "mine"], target="tiny", dtype="float32",
                    ids=[81, 82], max_new_tokens=32, temperatures=[0.7], acceptance="typical", checkpoint="ck/eagle",
                    settings={"tree_budget": "auto"}, compile=True,
                    prompt_files={"mine": {"path": "/data/my set/question.jsonl", "sha256": "ab" * 32}})
    command = command_line(cfg.to_dict(), Path("/runs/r1"))
    assert command == ("python cli.py run --method pld,eagle --benchmark 'mt_bench,mine=/data/my set/question.jsonl' "
                       "--temperature 0.7 --target tiny --dtype float32 --compile --acceptance typical --ids 81,82 "
                       "--max-new-tokens 32 --checkpoint ck/eagle --tree-budget auto --out /runs/r1")
    name, params = parse(command)
    assert name == "run" and params["temperature"] == 0.7 and params["compile_"] is True
    assert (params["ids"], params["checkpoint"], params["tree_budget"]) == ("81,82", "ck/eagle", "auto")
    # at its default rule the acceptance is left out
    plain = RunConfig(methods=["pld"], benchmarks=["gsm8k"], temperatures=[0.0]).to_dict()
    assert "--acceptance" not in command_line(plain, Path("/runs/r2"))
