"""`cli.py check-method NAME|module:Class`: is a drafter correct, whoever wrote it?

`check_method` loads the target, builds the drafter (random seeded weights on the tiny target,
else as a run builds it), picks the prompts (the first questions of every benchmark) and runs the
checks of harness/runs/method_checks.py on them in order (config, greedy = AR, the tree budget,
edge cases, the draft law q, the law at T > 0, the tree contract, begin/propose/observe across
resumed answers, checkpoint round trip, draft time); `render_card` prints their card.

Every drafter is held to two budgets: the large one (`--tree-budget`, default 15 draft nodes) that
every check but the small-budget answers runs at, and SMALL_BUDGET. Each reaches the drafter as
`DraftContext.budget` in every proposal and, where the class has a `budget_overrides` hook, as its
config too: a fixed, machine-independent tree, so the budget can be checked and a resumed answer
(which has no acceptance history to size a tree from) proposes what the running one did.

What each check can and cannot catch, and what a card costs in target forwards and draws:
docs/check-method.md.
"""
from __future__ import annotations

import json
import random
from typing import Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.runs.method_checks import (
    SMALL_BUDGET,
    TITLES,
    Card,
    CheckOptions,
    Subject,
    ar_answers,
    check_budget,
    check_checkpoint,
    check_config,
    check_edges,
    check_law,
    check_protocol,
    check_q,
    check_trees,
    greedy_row,
    run_greedy,
    split_by_prompt,
    timing_row,
)


# ----------------------------------------------------------------------------- building

def load_target(opts: CheckOptions) -> Target:
    return Target.load(opts.target, opts.device, opts.dtype)


def build_drafter(cls: type, target: Target, overrides: dict[str, Any], opts: CheckOptions, random_init: bool):
    """The drafter under test: random weights (seeded, rounded to bf16, the checkpoint storage, so
    a round trip can be exact) where asked, else as a run builds it (weights found or --checkpoint)."""
    if random_init and cls.trainable and not opts.checkpoint:
        torch.manual_seed(opts.seed)
        drafter = cls(target, overrides).to(device=target.device, dtype=target.dtype).eval()
        with torch.no_grad():
            for p in drafter.parameters():
                if p.is_floating_point():
                    p.copy_(p.to(torch.bfloat16).to(p.dtype))
        return drafter
    return cls.create(target, overrides, opts.checkpoint)


def at_budget(cls: type, target: Target, opts: CheckOptions, budget: int | str | None, random_init: bool,
              card: Card, reuse: Subject | None = None) -> Subject:
    """The drafter held to `budget`: built with its `budget_overrides` where it has them and they
    build here (Medusa/Hydra need fitted candidates for them), else as configured (`reuse`d when
    given: nothing to rebuild); the budget reaches every proposal as DraftContext.budget either way."""
    hook = cls.budget_overrides(budget) if budget is not None else {}
    nodes = budget if isinstance(budget, int) else None
    if hook:
        overrides = {**hook, **opts.settings}
        try:
            return Subject(build_drafter(cls, target, overrides, opts, random_init), nodes,
                           "through budget_overrides and DraftContext.budget")
        except SpecbenchError as e:
            card.config["note"] = f"budget_overrides({budget}) do not build here ({str(e).splitlines()[0]}); as configured"
    drafter = reuse.drafter if reuse is not None else build_drafter(cls, target, dict(opts.settings), opts, random_init)
    return Subject(drafter, nodes, "as DraftContext.budget alone" + (
        "" if hook else " (the class has no budget_overrides)"))


def small_budget(large: int | str | None) -> int | None:
    """The small of the two budgets: SMALL_BUDGET, below a numeric large one (none below 2)."""
    if isinstance(large, int):
        return min(SMALL_BUDGET, large - 1) or None
    return SMALL_BUDGET


# ----------------------------------------------------------------------------- prompts

def check_prompts(target: Target, opts: CheckOptions) -> list[tuple[str, list[int]]]:
    """(label, prompt ids): the first `prompts` questions of every benchmark, chat-templated; a
    target without a tokenizer (the tiny one) gets as many seeded random token prompts."""
    from harness.runs.benchmarks import benchmark_names, load_questions, resolve_data_dir

    names = benchmark_names()
    if target.tokenizer is None:
        rng = random.Random(opts.seed)
        n = max(1, opts.prompts) * max(1, len(names))
        return [(f"random {i}", [rng.randrange(target.vocab_size) for _ in range(rng.randint(12, 40))])
                for i in range(n)]
    data = resolve_data_dir(opts.data_dir)
    out = []
    for b in names:
        for q in load_questions(b, data, limit=opts.prompts):
            out.append((f"{b} {q.question_id}", target.encode_chat([{"role": "user", "content": q.turns[0]}])))
    return out


def q_states(proposals) -> list[list[int]]:
    """The q check's drafter states: the contexts of two proposals of the greedy answers (a third
    and two thirds of the way through them)."""
    picks = {len(proposals) // 3, 2 * len(proposals) // 3} if proposals else set()
    return [proposals[i].tokens for i in sorted(picks)]


def check_method(name: str, opts: CheckOptions, target: Target | None = None) -> Card:
    """Every check of `name` (a method name or module:Class) on `opts.target`: the card
    of the rules in harness/runs/method_checks.py."""
    from harness.runs.law_search import law_candidates
    from methods.registry import get_method, method_info

    cls = get_method(name)
    target = target or load_target(opts)
    random_init = opts.random_init if opts.random_init is not None else target.tokenizer is None
    card = Card(name, method_info(name), target.name, str(target.dtype).replace("torch.", ""), {}, "")
    check_config(cls, card)
    large = at_budget(cls, target, opts, opts.tree_budget, random_init, card)
    drafter = large.drafter
    card.config.update({k: v for k, v in drafter.config.items() if k not in cls.defaults or cls.defaults[k] != v})
    card.weights = ("random (seeded), rounded to bf16" if random_init and cls.trainable and not opts.checkpoint
                    else str(getattr(drafter, "checkpoint_hash", lambda: None)() or "none"))
    prompts = check_prompts(target, opts)
    ar = ar_answers(target, prompts, opts)
    greedy = run_greedy(target, large, prompts, ar, opts)
    subjects, small_run = [large], None
    if (budget := small_budget(opts.tree_budget)) is not None:
        small = at_budget(cls, target, opts, budget, random_init, card, reuse=large)
        subjects.append(small)
        small_run = run_greedy(target, small, prompts[:: max(1, opts.prompts)], ar, opts)
    greedy_row(greedy, small_run, card)
    label, base = prompts[0]
    edge_rec = check_edges(target, large, base, ar[label].output_ids[:2], card)
    q_rec = check_q(target, large, cls, q_states(greedy.rec.proposals), opts, card)
    contexts = [(lbl, pr.tokens, pr.accepted) for (lbl, _), props in
                zip(prompts, split_by_prompt(greedy.rec.proposals, prompts)) for pr in props]
    law_rec = check_law(target, large, cls, law_candidates(target, contexts), opts, card)
    recorders = [r for r in (greedy.rec, small_run and small_run.rec, edge_rec, q_rec, law_rec) if r is not None]
    check_budget(recorders, subjects, card)
    check_trees(recorders, target, card)
    if greedy.rec.proposals and not greedy.crashes:
        check_protocol(target, large, greedy.rec, prompts, opts, card)
        check_checkpoint(cls, target, large, greedy.rec, card)
    else:
        card.add("protocol", "skip", "no complete answer to resume")
    timing_row(greedy.runs, card)
    order = list(TITLES)
    card.results.sort(key=lambda r: order.index(r.rule) if r.rule in order else len(order))
    return card


# ----------------------------------------------------------------------------- the card

STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim", "info": "cyan"}


def render_card(card: Card) -> list:
    """The card as rich renderables: a header, one row per check, and one plain line per failure
    (`FAIL <check>: <rule>: ...`) that a CI log or a grep can find."""
    from rich.table import Table
    from rich.text import Text

    info = card.info
    paper = f"; {info.paper}" if info.paper else ""
    table = Table(title=f"check-method {card.method}: {info.display_name} ({info.source}{paper}) on "
                  f"{card.target} {card.dtype}; weights {card.weights}", title_justify="left", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for r in card.results:
        table.add_row(r.title, Text(r.status.upper(), style=STYLE.get(r.status, "")), r.detail)
    out: list = [table]
    if card.config:
        out.append(Text("config: " + json.dumps(card.config, default=str)[:400]))
    out += [Text(f"FAIL {r.title}: {r.detail}", style="red") for r in card.results if r.status == "fail"]
    verdict = "every check passed" if card.passed else "not conformant"
    out.append(Text(f"{'PASS' if card.passed else 'FAIL'}: {card.method} {verdict}", style="bold"))
    return out
