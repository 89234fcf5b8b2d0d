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


def test_each_eagle3_variant_changes_one_architecture_key_of_the_recipe() -> None:
    eagle3 = get_method("eagle3")
    recipe = eagle3.resolve_config(parts.RECIPE)
    for name, (method, overrides, decoded, _) in parts.VARIANTS.items():
        if method != "eagle3":
            continue
        cfg = eagle3.resolve_config({**parts.RECIPE, **overrides})
        changed = {k for k in eagle3.arch_keys if cfg[k] != recipe[k]}
        assert len(changed) == (0 if name == "eagle3" else 1), (name, changed)
        assert decoded == "eagle3"


def test_each_eagle2_variant_is_eagle_with_at_most_one_architecture_key_changed() -> None:
    eagle = get_method("eagle")
    base = eagle.resolve_config({})
    names = {name: overrides for name, (method, overrides, _, _) in parts.VARIANTS.items() if method == "eagle"}
    assert set(names) == {"eagle2", "eagle2-full-vocab"}
    for name, overrides in names.items():
        cfg = eagle.resolve_config(overrides)
        changed = {k for k in eagle.arch_keys if cfg[k] != base[k]}
        assert changed == ({"draft_vocab"} if name == "eagle2-full-vocab" else set()), (name, changed)


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
