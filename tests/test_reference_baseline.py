"""τ regression check of the committed reference drafters against the committed baseline.

Greedy τ in float32 on a CPU is deterministic, so a drop means the drafter, the tree or the
verifier changed. Drafters whose reference weights are committed are added to the baseline
(`results/baselines/`) as they land; `pld` needs none.
"""
from __future__ import annotations

from pathlib import Path

from harness.regress import check
from harness.runner import RunConfig, Runner

BASELINE = Path(__file__).resolve().parent.parent / "results" / "baselines" / "smollm2-135m-pld-float32.json"


def test_reference_tau_has_not_dropped(smollm2_fp32, shared_data, tmp_path):
    # The same settings as the command that wrote the baseline (see its "source" and README).
    cfg = RunConfig(methods=["pld"], benchmarks=["mt_bench", "gsm8k"], target="smollm2-135m", dtype="float32",
                    device="cpu", limit=2, max_new_tokens=32)
    Runner(cfg, tmp_path / "run", shared_data, target=smollm2_fp32).run()
    verdict = check(tmp_path / "run", BASELINE)
    assert verdict.exit_code == 0, verdict.failed
