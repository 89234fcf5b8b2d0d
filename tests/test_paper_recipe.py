"""The paper recipe (docs/reproduce-papers.md) as far as it runs without the hub: a hub-format target
folder made here (Vicuna-shaped, random weights, its own tokenizer) and synthetic checkpoints in the
official layouts of Medusa, Hydra, EAGLE (EAGLE-2 reads it), EAGLE-3 and Gumiho go through
`cli.py run --dtype float16` end to end on the CPU: every method loads, answers, writes records in
float16, and every greedy divergence from AR is a near tie."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from harness.runs.metrics import attach_divergences
from harness.runs.results import RunDir
from harness.testing.hub_layouts import text_of, vicuna_like, write_hub_target, write_official
from tests.test_exactness import prompts

METHODS = ("medusa", "hydra", "eagle", "eagle2", "eagle3", "gumiho")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """(target folder, prompt file, config): the locally made hub-format target and its prompts."""
    root = tmp_path_factory.mktemp("recipe")
    cfg = vicuna_like()
    target = write_hub_target(root / "vicuna-like", cfg)
    lines = [{"question_id": i, "category": "random", "turns": [text_of(p)]}
             for i, p in enumerate(prompts(cfg.vocab_size, n=2))]
    prompt_file = root / "tiny_prompts" / "question.jsonl"
    prompt_file.parent.mkdir()
    prompt_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return target, prompt_file, cfg


@pytest.mark.parametrize("method", METHODS)
def test_official_checkpoint_runs_end_to_end_in_float16(recipe, tmp_path, method):
    from cli import app

    target, prompt_file, cfg = recipe
    ck = write_official(method, tmp_path / "ck", cfg)
    out = tmp_path / "run"
    args = ["run", "--method", method, "--target", str(target), "--checkpoint", str(ck), "--dtype", "float16",
            "--device", "cpu", "--benchmark", str(prompt_file), "--max-new-tokens", "12", "--out", str(out)]
    if method in ("eagle2", "eagle3", "gumiho"):
        args += ["--tree-budget", "15"]  # a fixed tree: no cost curve to measure here
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = attach_divergences(RunDir(out).read_records())
    assert {r.method for r in records} == {"ar", method} and len(records) == 4
    assert all(r.dtype == "float16" and r.new_tokens == 12 for r in records)
    for r in records:
        div = r.divergence
        assert div is None or div["near_tie"], f"{method}: greedy float16 output left AR's by more than a tie: {div}"
    assert all(r.checkpoint_hash for r in records if r.method == method)  # the official weights, hashed


def test_compare_finds_official_checkpoints_by_target_and_method(recipe, tmp_path, monkeypatch):
    """The recipe's `compare` line: released folders placed as $SPECBENCH_CHECKPOINTS/<target>/<method>
    (EAGLE-2 reads EAGLE's) are found whatever their weight file is called, and all six methods
    answer beside AR in one float16 run, tables written."""
    from cli import app

    target, prompt_file, cfg = recipe
    monkeypatch.chdir(target.parent)  # the target by a relative name, as a hub id would be
    ck = tmp_path / "ckpts"
    for m in ("medusa", "hydra", "eagle", "eagle3", "gumiho"):
        write_official(m, ck / target.name / m, cfg)
    monkeypatch.setenv("SPECBENCH_CHECKPOINTS", str(ck))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "grid"
    args = ["compare", "--methods", ",".join(METHODS), "--target", target.name, "--dtype", "float16", "--device", "cpu",
            "--benchmarks", str(prompt_file), "--max-new-tokens", "8", "--out", str(out)]
    for m in ("eagle2", "eagle3", "gumiho"):
        args += ["--set", f"{m}.total_tokens=16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = RunDir(out).records()
    assert {r["method"] for r in records} == {"ar", *METHODS} and len(records) == 2 * (1 + len(METHODS))
    assert list((out / "tables").glob("*.md"))
