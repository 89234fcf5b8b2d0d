"""Broken checkpoints and killed runs, as a user meets them: one line with exit code 2 naming the
file and the fix, a `kill -9` that loses no finished answer and duplicates none on resume, and a
`kill` that stops work the way Ctrl-C does."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from cli import app
from harness.runs.config import RunConfig
from harness.runs.executor import run_grid
from harness.runs.results import RunDir

REPO = Path(__file__).resolve().parent.parent
EAGLE = REPO / "checkpoints" / "smollm2-135m" / "eagle"
cli = CliRunner()


def error_line(result) -> str:
    """The run's single `error:` line; nothing else may be an error or a traceback (a load-average
    warning printed before the model loads is allowed)."""
    assert result.exit_code == 2, result.output
    text = result.output
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and text.rstrip().splitlines()[-1] == errors[0], text
    return errors[0]


@pytest.fixture
def eagle_copy(tmp_path) -> Path:
    folder = tmp_path / "ck"
    shutil.copytree(EAGLE, folder)
    return folder


def run_with_checkpoint(folder: Path, shared_data: Path, out: Path):
    return cli.invoke(app, ["run", "--method", "eagle2", "--checkpoint", str(folder), "--limit", "1",
                            "--max-new-tokens", "4", "--dtype", "float32", "--data-dir", str(shared_data),
                            "--out", str(out)])


def test_truncated_weights_name_the_file(eagle_copy, shared_data, tmp_path):
    os.truncate(eagle_copy / "model.safetensors", 1000)
    line = error_line(run_with_checkpoint(eagle_copy, shared_data, tmp_path / "r"))
    assert "model.safetensors is not a readable weight file" in line and "train --method eagle" in line


def test_config_that_is_not_json_names_the_file(eagle_copy, shared_data, tmp_path):
    (eagle_copy / "config.json").write_text('{"format": "specbench",\n')
    line = error_line(run_with_checkpoint(eagle_copy, shared_data, tmp_path / "r"))
    assert "config.json is not valid JSON" in line and "copy the checkpoint again" in line


def test_tensors_of_the_wrong_shape_name_the_tensor(eagle_copy, shared_data, tmp_path):
    state = load_file(str(eagle_copy / "model.safetensors"))
    state["fc.weight"] = torch.zeros(64, 128, dtype=state["fc.weight"].dtype)  # another target's hidden size
    save_file(state, str(eagle_copy / "model.safetensors"))
    line = error_line(run_with_checkpoint(eagle_copy, shared_data, tmp_path / "r"))
    assert "tensor 'fc.weight' has shape [64, 128]" in line and "needs [576, 1152]" in line
    assert "train --method eagle --target smollm2-135m" in line


def _records(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_kill_9_then_a_torn_line_then_resume_gives_every_record_once(smollm2_fp32, shared_data, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, str(REPO / "cli.py"), "run", "--method", "pld", "--benchmark", "mt_bench", "--limit", "2",
           "--max-new-tokens", "16", "--dtype", "float32", "--data-dir", str(shared_data), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _records(out / "records.jsonl") < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = _records(out / "records.jsonl")
    assert 3 <= done < 8, f"the kill must land mid-run ({done} of 8 answers written)"
    before = (out / "records.jsonl").read_bytes()
    with open(out / "records.jsonl", "ab") as f:  # a record cut off mid-write
        f.write(b'{"method":"pld","config_hash":"')
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    after = (out / "records.jsonl").read_bytes()
    assert after.startswith(before), "finished records stay byte-identical"
    resumed = [r["key"] for r in RunDir(out).records()]
    assert len(resumed) == len(set(resumed)) == 8
    # The same run uninterrupted, in this process: the same keys and the same answers.
    cfg = RunConfig(methods=["pld"], benchmarks=["mt_bench"], target="smollm2-135m", dtype="float32", device="cpu",
                    limit=2, max_new_tokens=16)
    ref_dir = run_grid(cfg, tmp_path / "ref", shared_data, target=smollm2_fp32)
    ref = {r["key"]: r["output_ids"] for r in RunDir(ref_dir).records()}
    assert sorted(resumed) == sorted(ref)
    assert all(ref[r["key"]] == r["output_ids"] for r in RunDir(out).records())
    assert json.loads((out / "meta.json").read_text())["runs"][1:]  # the resume is on record


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_kill_stops_like_ctrl_c_even_when_the_shell_ignored_sigint(stop):
    """What the CLI installs: SIGTERM, and a SIGINT that `cmd &` in a script leaves ignored, raise
    KeyboardInterrupt, the exception on which a trainer saves its resume state."""
    work = ("import sys, time\n"
            "from harness.core.stopping import interrupt_on_stop_signals\n"
            "interrupt_on_stop_signals()\n"
            "try:\n    print('ready', flush=True)\n    time.sleep(60)\n"  # ready inside the try: no race
            "except KeyboardInterrupt:\n    print('saved', flush=True)\n    sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", work], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(stop)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (out, proc.returncode) == ("saved\n", 130)


def test_a_script_stopped_like_ctrl_c_says_how_to_resume_as_the_cli_does(capsys):
    """The scripts' entry point (data_curve, eagle3_parts) ends a KeyboardInterrupt with the CLI's
    line and exit code 130, not a traceback: the trainer only names the step it saved."""
    from harness.core.stopping import INTERRUPTED
    from scripts.data_curve import run_script

    def stopped() -> int:
        raise KeyboardInterrupt

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_:
            run_script(stopped)
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    assert exit_.value.code == 130
    assert capsys.readouterr().err == f"interrupted: {INTERRUPTED}\n"
