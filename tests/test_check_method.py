"""`cli.py check-method`: every built-in drafter passes on the tiny target (random weights), and each
deliberately broken drafter (tests/broken_drafters.py) fails with the rule it breaks named; the
statistics and rules the card's checks rest on."""
from __future__ import annotations

import random
import re

import pytest
import torch
from harness.testing.random_drafters import DATASTORE_KEYS, builtin_methods, layers_needed
from typer.testing import CliRunner

from cli import app
from harness.core.decode import Generation
from harness.core.tree import DraftTree, StaticTree
from harness.runs.check_method import CheckOptions, check_method
from harness.runs.config import RunConfig
from harness.runs.executor import checked_classes
from harness.runs.law_check import detectable_shift, pit, uniformity_test
from harness.runs.method_checks import Card, timing_row
from harness.runs.q_check import tree_pits
from harness.runs.tree_contract import nested, tree_violations
from methods.registry import get_method
from tests.conftest import make_tiny_target
from tests.test_cli_errors import one_line_error, run_cli

GREEDY_ONLY = "tests.broken_drafters:GreedyOnly"

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
    return make_tiny_target(layers=7, name="tiny")


def statuses(card) -> dict[str, str]:
    return {r.rule: r.status for r in card.results}


def own_datastore(name: str, target, tmp_path_factory) -> dict[str, str]:
    """{key: a datastore of `target`'s greedy answers (64 tokens) to the card's prompts} for a method
    that reads a datastore, else {}."""
    from harness.core.decode import GenerationConfig, generate
    from harness.runs.check_method import check_prompts
    from methods.common.token_index import TokenIndex

    key = DATASTORE_KEYS.get(name)
    if key is None:
        return {}
    docs = [p + generate(target, p, GenerationConfig(64)).output_ids for _, p in check_prompts(target, CheckOptions(**FAST))]
    folder = tmp_path_factory.mktemp(f"{name}-datastore")
    TokenIndex.build(docs, {"vocab_hash": target.vocab_hash()}).save(folder)
    return {key: str(folder)}


@pytest.mark.parametrize("name", builtin_methods())
def test_every_builtin_method_passes_on_the_tiny_target(tiny, deep_tiny, name, tmp_path_factory):
    target = deep_tiny if layers_needed(name) > tiny.num_layers else tiny
    # SpS needs a draft model (the tiny twin), REST and SAM-Decoding a datastore: one of the target's
    # own answers, as a real corpus resembles a model's text (a random one is never accepted at T = 1)
    settings = {"draft": "tiny"} if name == "sps" else own_datastore(name, target, tmp_path_factory)
    card = check_method(name, CheckOptions(**FAST, settings=settings), target=target)
    got = statuses(card)
    # every check but the draft time, which is measured on this (shared) machine and judged in the Sleeps test
    failed = [(r.rule, r.detail) for r in card.results if r.status == "fail" and r.rule != "timing"]
    assert not failed, failed
    assert {got[r] for r in ("config", "greedy", "budget", "edge", "q", "tree", "protocol")} == {"pass"}, got
    # a drafter sampled from a fresh start that its long answers never see (Lookahead) may only warn
    assert got["law"] == ("pass" if getattr(get_method(name), "resumable", True) else "warn"), got
    assert got["checkpoint"] == ("pass" if card.info.trainable else "skip")
    sizes = {r.detail for r in card.results if r.rule == "budget"}
    assert "budget 4," in next(iter(sizes)) and "budget 15," in next(iter(sizes)), sizes


# (drafter, the rule it breaks, what its line says, other rules its break may drag down)
BROKEN = [
    ("FlatQ", "q", "do not follow the q the tree reports", {"law"}),
    ("UntemperedQ", "q", "do not follow the q the tree reports", {"law"}),
    ("DepthOneQ", "q", "do not follow the q the tree reports", {"law"}),
    ("SamplesWithoutQ", "q", "but the tree reports no q", {"law"}),
    ("ShortPromptRaises", "edge", "one-token prompt: raised in propose IndexError", set()),
    ("NoBudgetHook", "budget", "at a budget of 4, given as DraftContext.budget alone (the class has no "
     "budget_overrides)", set()),
    ("Sleeps", "timing", "slower than the target", set()),
    ("ProposesNothing", "law", "weakly exercised", set()),
    ("BiasedBonus", "law", "does not follow AR's law", {"q"}),
    ("ChildBeforeParent", "tree", "parents before children: node 1's parent 2 comes after it", {"greedy", "edge"}),
    ("IgnoresObserve", "protocol", "a proposal ignores what observe told it", set()),
    ("ForgetsNothing", "protocol", "begin does not reset the drafter's state", set()),
]


@pytest.mark.slow
@pytest.mark.parametrize("drafter,rule,needle,dragged", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_drafter_fails_naming_its_rule(tiny, drafter, rule, needle, dragged):
    card = check_method(f"tests.broken_drafters:{drafter}", CheckOptions(**FAST), target=tiny)
    failed = {r.rule: r.detail for r in card.results if r.status == "fail"}
    assert not card.passed and rule in failed and needle in failed[rule], failed
    # the one rule broken on purpose is the one that fails, beside what it drags with it
    assert set(failed) <= {rule} | dragged, failed


def test_q_that_is_right_at_depth_1_only_fails_below_it(tiny):
    card = check_method("tests.broken_drafters:DepthOneQ", CheckOptions(**FAST), target=tiny)
    detail = next(r.detail for r in card.results if r.rule == "q")
    assert re.search(r"depth [2-9] the drafted tokens", detail), detail


@pytest.mark.parametrize("drafter", ["ContextLookup", "SampledBigram"])
def test_the_correct_twins_of_the_broken_drafters_pass(tiny, drafter):
    card = check_method(f"tests.broken_drafters:{drafter}", CheckOptions(**FAST), target=tiny)
    got = statuses(card)
    assert all(s in ("pass", "skip") for rule, s in got.items() if rule != "timing"), card.results
    q = next(r.detail for r in card.results if r.rule == "q")
    assert ("trees with q" in q) == (drafter == "SampledBigram"), q


def test_a_greedy_only_drafter_is_refused_at_t_above_0_and_skipped_by_the_card(tiny, shared_data):
    card = check_method("tests.broken_drafters:GreedyOnly", CheckOptions(**FAST), target=tiny)
    got = statuses(card)
    assert card.passed and got["q"] == got["law"] == "skip", got
    for args in (["run", "--method", GREEDY_ONLY, "-t", "0.7"],
                 ["compare", "--methods", GREEDY_ONLY, "-t", "0", "-t", "1"],
                 ["ablate", GREEDY_ONLY, "--set", "max_draft=2,3", "-t", "1"]):
        one_line_error(run_cli(*args, "--data-dir", str(shared_data)), "declares acceptance rules greedy only",
                       "cannot sample losslessly at --temperature")
    cfg = RunConfig(methods=[GREEDY_ONLY], benchmarks=["mt_bench"], temperatures=[0.0])
    assert list(checked_classes(cfg)) == [GREEDY_ONLY]  # T = 0 is fine


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


def test_pit_values_are_uniform_under_their_law_and_not_otherwise():
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    laws = [torch.softmax(torch.randn(30, generator=g) * 2, 0) for _ in range(50)]  # a new law per token
    honest = [pit(p, int(torch.multinomial(p, 1, generator=g)), rng.random()) for p in laws for _ in range(40)]
    assert uniformity_test(honest)[2] > 1e-3
    tempered = [pit(p, int(torch.multinomial(p ** 2 / (p ** 2).sum(), 1, generator=g)), rng.random())
                for p in laws for _ in range(40)]  # drawn at T = 0.5, judged against T = 1
    assert uniformity_test(tempered)[2] < 1e-6
    # more samples detect a smaller shift; a few hundred resolve about a tenth of the mass
    assert detectable_shift(4000, 1e-3) < detectable_shift(400, 1e-3) < 0.15


def test_a_sibling_drawn_twice_has_no_probability_left():
    tree = DraftTree(torch.tensor([5, 7, 7]), torch.tensor([-1, 0, 0]))
    tree.q = torch.zeros(3, 10)
    tree.q[0, 7], tree.q[0, 8] = 0.5, 0.5
    values, problem = tree_pits(tree, random.Random(0))
    assert len(values) == 1 and "node 2 (depth 1) drafts token 7" in problem


def test_a_static_tree_keeps_its_best_first_choices_within_a_budget():
    tree = StaticTree.named("cpu_15")
    assert tree.first(4).choices == [[0], [0, 0], [1], [0, 1]]  # the preset's first four, closed under parents
    unordered = StaticTree([[0, 0], [1], [0]])  # a child listed before its parent: by depth instead
    assert sorted(unordered.first(2).choices) == [[0], [1]]


def test_draft_time_is_judged_per_new_token_against_the_ar_step():
    def runs(draft_ms: float, ar_ms: float):
        drafter = Generation([1] * 20, 5, 0.0, 0.0, "length", draft_ms=[draft_ms] * 10)
        ar = Generation([1] * 20, 5, 0.0, 0.0, "length", verify_ms=[ar_ms] * 20)
        return [("ar", ar), ("drafter", drafter)]

    def status(draft_ms: float, ar_ms: float) -> str:
        card = Card("m", None, "t", "float32", {}, "")
        timing_row(runs(draft_ms, ar_ms), card)
        return card.results[0].status

    # 2 new tokens per step: 30 ms per step is 15 ms per token
    assert [status(30, 40), status(50, 40), status(90, 40)] == ["pass", "warn", "fail"]
    assert status(30, 0.5) == "fail" and status(9, 0.5) == "pass"  # a sub-floor AR step is judged as 10 ms


def test_a_long_context_gets_its_limit_simulated_just_past_the_prompt(tiny):
    from harness.core.decode import GenerationConfig, generate
    from harness.runs.edge_cases import context_limit_at, edge_cases, run_case
    from methods.registry import get_method

    base = [(7 * i) % 96 for i in range(20)]
    with context_limit_at(tiny, 4096):  # as a target of a 4k context
        case = next(c for c in edge_cases(tiny, base, [1, 2]) if c.name.startswith("context limit"))
    assert case.name == "context limit (set just past the prompt: 28 tokens)" and case.prompt == base
    with case.setting():
        ar = generate(tiny, case.prompt, GenerationConfig(case.max_new_tokens))
    assert ar.stop_reason == "context" and len(ar.output_ids) < case.max_new_tokens
    assert tiny.config.max_position_embeddings == 512  # the target is left as it was
    assert run_case(tiny, get_method("pld")(tiny), case, 15) == ""
