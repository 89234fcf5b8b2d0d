"""Bad input gets one clear line (exit 2), before any model is loaded."""
from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()


def run_cli(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


def one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert text.startswith("error:") and len(text.splitlines()) == 1, text
    for n in needles:
        assert n in text, text


@pytest.mark.parametrize("args,needles", [
    (["--method", "pdl"], ["unknown method 'pdl'", "did you mean 'pld'"]),
    (["--method", "pld", "--benchmark", "gsm9k"], ["unknown benchmark", "gsm8k"]),
    (["--method", "pld", "--target", "smollm-135m"], ["unknown target", "smollm2-135m"]),
    (["--method", "pld", "--max-new-tokens", "0"], ["--max-new-tokens must be >= 1"]),
    (["--method", "pld", "--acceptance", "typical"], ["needs --temperature > 0"]),
    (["--method", "pld", "--temperature", "0.7", "--acceptance", "greedy"], ["--acceptance greedy"]),
    (["-m", "pld", "-t", "0.7", "--acceptance", "greedy"], ["--acceptance greedy"]),  # -t as compare takes it
    (["-m", "pld", "-t", "-1"], ["--temperature must be >= 0"]),
    (["--method", "pld", "--set", "max_drafts=3"], ["no config key 'max_drafts'", "max_draft"]),
    (["--method", "pld", "--limit", "0"], ["--limit must be >= 1"]),
    (["--method", "pld", "--checkpoint", "x"], ["no method of this run loads weights"]),
])
def test_bad_run_options(shared_data, args, needles):
    one_line_error(run_cli("run", *args, "--data-dir", str(shared_data)), *needles)


@pytest.mark.parametrize("args,needles", [
    # a rule no temperature of the grid takes is refused, as `run` refuses it
    (["compare", "-m", "pld", "-t", "0", "--acceptance", "typical"], ["needs --temperature > 0"]),
    (["compare", "-m", "pld", "-t", "0", "--typical", "pld"], ["--typical", "needs a --temperature > 0"]),
    (["compare", "-m", "pld,pld"], ["lists a method twice"]),
    (["ablate", "pld", "--set", "max_draft=2,3", "--limit", "0"], ["--limit must be >= 1"]),
])
def test_bad_grid_options(shared_data, args, needles):
    one_line_error(run_cli(*args, "--data-dir", str(shared_data)), *needles)


@pytest.mark.parametrize("method", ["pld", "eagle2"])
def test_calibrate_tree_refuses_methods_without_a_static_tree(method):
    one_line_error(run_cli("calibrate-tree", "--method", method), "does not draft a static tree", "medusa")


def test_missing_data_dir(tmp_path):
    one_line_error(run_cli("run", "--method", "pld", "--data-dir", str(tmp_path / "nope")), "nope")
    one_line_error(run_cli("run", "--method", "pld", env={"SPECBENCH_DATA": ""}), "--data-dir")


def test_malformed_jsonl_names_the_line(shared_data, tmp_path):
    shutil.copytree(shared_data / "mt_bench", tmp_path / "mt_bench")
    path = tmp_path / "mt_bench" / "question.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-3]
    path.write_text("\n".join(lines) + "\n")
    one_line_error(run_cli("run", "--method", "pld", "--data-dir", str(tmp_path)), ":5:")


def test_empty_prompt_is_refused(tiny_target):
    from harness.core.decode import GenerationConfig, generate
    from harness.core.errors import SpecbenchError

    with pytest.raises(SpecbenchError, match="empty prompt"):
        generate(tiny_target, [], GenerationConfig(4))


def test_list_names_methods_and_benchmarks():
    out = run_cli("list").output
    assert "pld" in out and "mt_bench" in out and "smollm2-135m" in out
