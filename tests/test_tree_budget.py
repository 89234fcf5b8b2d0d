"""`--tree-budget N|auto`: one switch sizes every tree method alike, explicit --set keys win, and a
pinned budget is the tree's size whatever this machine's verify cost curve says."""
from __future__ import annotations

import pytest

from harness.core.decode import GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.runs.settings import TREE_BUDGET, check_settings, method_overrides, parse_tree_budget
from methods.registry import get_method
from tests.test_tree_search import STEEP, _trained, calibrate_tree, save_tree, tiny_dataset


def test_each_tree_method_turns_the_budget_into_its_own_keys():
    settings = {TREE_BUDGET: 5}
    eagle_tree = get_method("eagle").defaults["tree"]
    assert method_overrides(get_method("eagle2"), settings, []) == {"total_tokens": 6}
    assert method_overrides(get_method("gumiho"), settings, []) == {"total_tokens": 6}
    assert method_overrides(get_method("eagle"), settings, []) == {"tree": eagle_tree[:5]}
    assert method_overrides(get_method("medusa"), settings, []) == {"tree": "auto:5"}
    assert method_overrides(get_method("hydra"), settings, []) == {"tree": "auto:5"}
    assert method_overrides(get_method("pld"), settings, []) == {}
    auto = {TREE_BUDGET: "auto"}
    assert method_overrides(get_method("eagle2"), auto, []) == {"total_tokens": "auto"}
    assert method_overrides(get_method("hydra"), auto, []) == {"tree": "auto"}
    assert method_overrides(get_method("eagle"), auto, []) == {}
    # an explicit key beats the switch, for one method or all
    assert method_overrides(get_method("eagle2"), {TREE_BUDGET: 5, "eagle2.total_tokens": 9}, []) == {"total_tokens": 9}
    assert method_overrides(get_method("medusa"), {TREE_BUDGET: 5, "tree": "cpu_15"}, []) == {"tree": "cpu_15"}


@pytest.mark.parametrize("raw", ["0", "-3", "2.5", "many", None])
def test_a_bad_budget_is_one_clear_error(raw):
    with pytest.raises(SpecbenchError, match="--tree-budget"):
        parse_tree_budget(raw)
    with pytest.raises(SpecbenchError, match="--tree-budget"):
        check_settings({TREE_BUDGET: raw}, {"eagle2": get_method("eagle2")})


def test_a_good_budget_parses():
    assert parse_tree_budget("auto") == "auto" and parse_tree_budget(24) == 24 and parse_tree_budget("7") == 7
    check_settings({TREE_BUDGET: 24}, {"pld": get_method("pld"), "eagle2": get_method("eagle2")})


def test_heads_take_exactly_the_leading_n_fitted_candidates(tiny_target, tmp_path, monkeypatch):
    """tree=auto:N verifies the N most frequent fitted candidates even where the cost curve would
    keep one (STEEP), and decodes exactly as AR."""
    from harness.core import cost_model
    from tests.test_exactness import prompts

    cls = get_method("medusa")
    d = _trained(cls, tiny_target, tmp_path, {"heads": 3, "tree": "cpu_15"})
    result = calibrate_tree(d, tiny_dataset(tiny_target, n=40, seed=8).train, nodes=7)
    d.save_pretrained(tmp_path / "ck")
    save_tree(tmp_path / "ck", result)
    monkeypatch.setattr(cost_model, "verify_cost_curve", lambda target, repeats=5: STEEP)
    assert len(cls.from_pretrained(tmp_path / "ck", tiny_target).tree.choices) == 1
    pinned = cls.from_pretrained(tmp_path / "ck", tiny_target, {"tree": "auto:5"})
    assert pinned.tree.choices == [path for path, _ in result["candidates"][:5]]
    for p in prompts(tiny_target.vocab_size, n=2):
        ar = generate(tiny_target, p, GenerationConfig(16))
        out = generate(tiny_target, p, GenerationConfig(16), pinned)
        assert out.output_ids == ar.output_ids
        assert max(out.tree_size) == 5
    with pytest.raises(SpecbenchError, match="auto:N"):
        cls.from_pretrained(tmp_path / "ck", tiny_target, {"tree": "auto:x"})
