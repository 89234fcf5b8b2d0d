"""τ regression and exactness check of the committed reference drafters.

Greedy τ in float32 on a CPU is deterministic, so a drop means the drafter, the tree or the
verifier changed. Every drafter whose reference weights are committed under
`checkpoints/smollm2-135m/` is in the baseline (`results/baselines/`), on all six benchmarks; `pld`
needs none. The same run also proves greedy exactness with the real weights: no answer may differ
from AR's. The baseline was made on an Intel Xeon with AMX; the one before it, made on an AMD EPYC
without AMX, gave the same τ in all 36 cells of the learned drafters here, so float32 τ is compared
across CPU kinds with the default tolerance (regress only warns about the flags).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.runs.config import RunConfig
from harness.runs.executor import run_grid
from harness.runs.metrics import attach_divergences
from harness.runs.regress import check
from harness.runs.results import RunDir

BASELINE = Path(__file__).resolve().parent.parent / "results" / "baselines" / "smollm2-135m-reference-float32.json"


@pytest.mark.slow
def test_reference_tau_has_not_dropped_and_outputs_equal_ar(smollm2_fp32, shared_data, tmp_path):
    prov = json.loads(BASELINE.read_text())["provenance"]
    # The same settings as the command that wrote the baseline (see its "source" and README).
    cfg = RunConfig(methods=sorted(prov["checkpoints"]), benchmarks=list(prov["prompts"]), target="smollm2-135m",
                    dtype="float32", device="cpu", limit=2, max_new_tokens=prov["max_new_tokens"],
                    settings=prov.get("settings", {}))
    run = run_grid(cfg, tmp_path / "run", shared_data, target=smollm2_fp32)
    verdict = check(tmp_path / "run", BASELINE)
    assert verdict.exit_code == 0, verdict.failed
    diverged = [(r.method, r.benchmark, r.question_id, r.turn)
                for r in attach_divergences(RunDir(run).read_records()) if r.divergence]
    assert not diverged, f"answers that differ from AR in float32: {diverged}"
