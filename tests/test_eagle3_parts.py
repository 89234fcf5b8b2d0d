"""scripts/eagle3_parts.py: its variants are valid configs that each change one part, and its
report reads a committed run folder and checkpoint into the table's numbers."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.core.errors import SpecbenchError
from methods.registry import get_method
from scripts import eagle3_parts as parts

REPO = Path(__file__).resolve().parent.parent
CURVE = REPO / "results" / "reference" / "smollm2-135m" / "data-curve"


def test_each_variant_changes_one_architecture_key_of_its_method() -> None:
    """Every variant trains its method's baseline (EAGLE-3's recipe, or EAGLE's defaults) with one
    architecture key changed; the two baselines change none. EAGLE's variants decode as EAGLE-2."""
    baselines = {"eagle3", "eagle2"}
    changed_by = {}
    for name, (method, _, decoded, _) in parts.VARIANTS.items():
        cls = get_method(method)
        base = cls.resolve_config(parts.training_config("eagle3" if method == "eagle3" else "eagle2"))
        cfg = cls.resolve_config(parts.training_config(name))
        changed_by[name] = {k for k in cls.arch_keys if cfg[k] != base[k]}
        assert len(changed_by[name]) == (0 if name in baselines else 1), (name, changed_by[name])
        assert decoded == ("eagle3" if method == "eagle3" else "eagle2")
    assert {n for n, (m, *_) in parts.VARIANTS.items() if m == "eagle"} == {"eagle2", "eagle2-full-vocab"}
    assert changed_by["eagle2-full-vocab"] == {"draft_vocab"}


def test_report_reads_the_committed_recipe_point(tmp_path: Path) -> None:
    """The recipe's point of the data curve (same weights, same decoding settings) as the parts
    table's eagle3 row: τ, its interval around it, depth acceptance falling with depth, no answer off AR."""
    shutil.copytree(CURVE / "runs" / "eagle3-share0.25", tmp_path / "runs" / "eagle3")
    assert parts.main(["--variants", "eagle3", "--reuse", f"eagle3={REPO / 'checkpoints/smollm2-135m/eagle3'}",
                       "--out", str(tmp_path), "--report-only"]) == 0
    table = (tmp_path / "parts.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| eagle3 |"))
    assert "| 9,808,128 | 0.404 | 1.73 [" in row and row.endswith("| 20 (0) |")
    import pandas as pd

    r = pd.read_csv(tmp_path / "parts.csv").iloc[0]
    assert r.tau_lo < r.tau < r.tau_hi
    assert 1 > r.depth1 > r.depth2 > r.depth3 > 0
    assert 0.1 < r.blocked_by_vocab < 0.3  # 0.170: about one step in six ends on a token its head lacks


def test_unknown_variant_is_refused() -> None:
    with pytest.raises(SpecbenchError, match="no-such"):
        parts.main(["--variants", "no-such", "--report-only"])


def test_blocked_steps_count_bonus_tokens_outside_the_vocab() -> None:
    """Steps commit accepted drafts + the bonus token; a step cut at the token limit has no bonus.
    Output: prefill token 5, then steps (accepted, tokens) (1, 2) -> 6 7, (0, 1) -> 9, (2, 2) -> 3 4 (cut)."""
    from harness.runs.record import Record, Steps

    rec = Record(method="eagle3", benchmark="b", question_id=1, turn=0, temperature=0.0, acceptance="greedy",
                 seed=0, output_ids=[5, 6, 7, 9, 3, 4], first_token_from_prefill=True,
                 steps=Steps(accepted=[1, 0, 2], tokens=[2, 1, 2]))
    assert parts.steps_blocked_by_vocab([rec], {7, 3, 4}) == 0.5   # bonus 7 in, bonus 9 out; the cut step not counted
    assert parts.steps_blocked_by_vocab([rec], {7, 9}) == 0.0
    assert parts.steps_blocked_by_vocab([rec], None) == 0.0        # the whole vocabulary blocks nothing
