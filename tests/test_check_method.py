"""`cli.py check-method`: every built-in drafter passes on the tiny target (random weights), and each
deliberately broken drafter (tests/broken_drafters.py) fails with the rule it breaks named."""
from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from cli import app
from harness.core.tree import DraftTree
from harness.runs.check_method import CheckOptions, check_method
from harness.runs.tree_contract import nested, tree_violations
from tests.random_drafters import builtin_methods, datastore_settings, layers_needed

FAST = dict(target="tiny", prompts=1, max_new_tokens=24, law_samples=400)


@pytest.fixture(scope="module")
def tiny():
    from harness.core.target import Target

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add synchronisation
    yield Target.load("tiny", "cpu", "float32")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def deep_tiny(tiny):
    """The tiny Llama with 7 layers, for EAGLE-3 (it reads three distinct target layers)."""
    from harness.core.tiny_target import tiny_target

    return tiny_target(layers=7)


def statuses(card) -> dict[str, str]:
    return {r.rule: r.status for r in card.results}


@pytest.mark.parametrize("name", builtin_methods())
def test_every_builtin_method_passes_on_the_tiny_target(tiny, deep_tiny, name):
    target = deep_tiny if layers_needed(name) > tiny.num_layers else tiny
    # SpS needs a draft model (the tiny twin), REST and SAM-Decoding a datastore
    settings = {"draft": "tiny"} if name == "sps" else datastore_settings(name, target)
    card = check_method(name, CheckOptions(**FAST, settings=settings), target=target)
    got = statuses(card)
    assert card.passed, [(r.rule, r.detail) for r in card.results if r.status == "fail"]
    # the checks that must run (and pass) for every method; the law may be weakly exercised on random weights
    assert {got[r] for r in ("config", "greedy", "tree", "protocol")} == {"pass"}, got
    assert got["law"] in ("pass", "warn") and got["timing"] == "info"
    assert got["checkpoint"] == ("pass" if card.info.trainable else "skip")


@pytest.mark.parametrize("drafter,rule,needle,samples", [
    ("BiasedBonus", "law", "do not follow AR's law", 2000),
    ("ChildBeforeParent", "tree", "parents before children: node 1's parent 2 comes after it", 400),
    ("IgnoresObserve", "protocol", "a proposal ignores what observe told it", 400),
])
def test_a_broken_drafter_fails_naming_its_rule(tiny, drafter, rule, needle, samples):
    card = check_method(f"tests.broken_drafters:{drafter}", CheckOptions(**{**FAST, "law_samples": samples}), target=tiny)
    failed = {r.rule: r.detail for r in card.results if r.status == "fail"}
    assert not card.passed and rule in failed and needle in failed[rule], failed
    # the one rule broken on purpose is the one that fails, beside what it drags with it
    assert set(failed) <= {rule, "greedy"}, failed


def test_the_correct_twin_of_the_broken_drafters_passes(tiny):
    card = check_method("tests.broken_drafters:ContextLookup", CheckOptions(**FAST), target=tiny)
    assert card.passed and statuses(card)["protocol"] == "pass"


def test_the_cli_exits_1_naming_the_rule_and_0_when_conformant():
    runner = CliRunner()
    bad = runner.invoke(app, ["check-method", "tests.broken_drafters:ChildBeforeParent", "--target", "tiny",
                              "--prompts", "1", "--max-new-tokens", "16", "--law-samples", "200"])
    assert bad.exit_code == 1, bad.output
    assert "FAIL tree contract: parents before children" in bad.output
    good = runner.invoke(app, ["check-method", "tests.broken_drafters:ContextLookup", "--target", "tiny",
                               "--prompts", "1", "--max-new-tokens", "16", "--law-samples", "200"])
    assert good.exit_code == 0, good.output
    assert "PASS: tests.broken_drafters:ContextLookup every check passed" in good.output
    missing = runner.invoke(app, ["check-method", "no_such_pkg.mod:Drafter", "--target", "tiny"])
    assert missing.exit_code == 2 and "cannot import no_such_pkg.mod" in missing.output


def test_tree_rules_name_what_is_broken():
    chain = DraftTree.chain(5, [7, 8, 9])
    assert tree_violations(chain, 5, max_nodes=4, vocab_size=10, budget=3) == []
    assert tree_violations(chain, 6, 4, 10)[0].startswith("root: node 0 holds token 5, not the root 6")
    assert tree_violations(chain, 5, 3, 10) == ["room: 3 deep with room for 3 new token(s) (at most 2 deep)"]
    assert tree_violations(chain, 5, 4, 10, budget=2) == ["budget: 3 draft nodes over the tree budget of 2"]
    assert tree_violations(chain, 5, 4, 9)[0] == "tokens: id 9 is outside the vocabulary of 9"
    sampled = DraftTree.chain(5, [7])
    sampled.q = torch.zeros(2, 10)
    sampled.q[0, 3] = 1.0  # the drafted 7 has q = 0: it cannot have been drawn from this row
    assert tree_violations(sampled, 5, 4, 10)[0].startswith("q: node 1's token 7 has q = 0 under node 0")


def test_nested_trees_are_one_proposal_cut_to_two_budgets():
    long, short = DraftTree.chain(1, [2, 3, 4]), DraftTree.chain(1, [2, 3])
    assert nested(long, short) and nested(short, long)
    assert not nested(long, DraftTree.chain(1, [2, 9]))
