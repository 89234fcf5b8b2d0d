"""`cli.py check-method NAME|module:Class`: is a drafter correct, whoever wrote it?

`check_method` loads the target, builds the drafter (random seeded weights on the tiny target,
else as a run builds it), picks the prompts (the first questions of every benchmark) and runs the
checks of harness/runs/method_checks.py on them in order (config, greedy = AR, the law at T = 1,
the tree contract, begin/propose/observe across resumed answers, checkpoint round trip, draft
time); `render_card` prints their card.
The drafter runs with `--tree-budget` (default 15 draft nodes, through its `budget_overrides`):
a fixed, machine-independent tree, so the budget can be checked and a resumed answer (which has no
acceptance history to size a tree from) proposes what the running one did.
"""
from __future__ import annotations

import json
import random
from typing import Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.runs.method_checks import (
    TITLES,
    Card,
    CheckOptions,
    check_checkpoint,
    check_config,
    check_law,
    check_protocol,
    check_trees,
    run_greedy,
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


def with_budget(cls: type, target: Target, opts: CheckOptions, random_init: bool, card: Card):
    """(drafter, its tree budget in draft nodes or None, the overrides it was built with): built with
    `--tree-budget` where the method takes one and it builds here (Medusa/Hydra need fitted
    candidates for it), else as configured."""
    budget = opts.tree_budget
    extra = cls.budget_overrides(budget) if budget is not None else {}
    overrides = {**extra, **opts.settings}
    try:
        drafter = build_drafter(cls, target, overrides, opts, random_init)
    except SpecbenchError as e:
        if not extra:
            raise
        card.config["note"] = f"--tree-budget {budget} does not build here ({str(e).splitlines()[0]}); as configured"
        return build_drafter(cls, target, dict(opts.settings), opts, random_init), None, dict(opts.settings)
    nodes = budget if (extra and isinstance(budget, int)) else None
    return drafter, nodes, overrides


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


def law_prompt(target: Target, prompts: list[tuple[str, list[int]]], answers: dict[str, list[int]]) -> tuple[str, list[int]]:
    """The law check's prompt: GSM8K's first where there is one (drafts are often accepted there),
    else the first prompt followed by 16 tokens of its greedy answer (n-grams to match)."""
    for label, p in prompts:
        if label.startswith("gsm8k"):
            return label, p
    label, p = prompts[0]
    return f"{label} + 16 answer tokens", p + answers[label][:16]


def check_method(name: str, opts: CheckOptions, target: Target | None = None) -> Card:
    """Every check of `name` (a method name or module:Class) on `opts.target`: the card
    of the rules in harness/runs/method_checks.py."""
    from methods.registry import get_method, method_info

    cls = get_method(name)
    target = target or load_target(opts)
    random_init = opts.random_init if opts.random_init is not None else target.tokenizer is None
    card = Card(name, method_info(name), target.name, str(target.dtype).replace("torch.", ""), {}, "")
    check_config(cls, card)
    drafter, budget, overrides = with_budget(cls, target, opts, random_init, card)
    card.config.update({k: v for k, v in drafter.config.items() if k not in cls.defaults or cls.defaults[k] != v})
    card.weights = ("random (seeded), rounded to bf16" if random_init and cls.trainable and not opts.checkpoint
                    else str(getattr(drafter, "checkpoint_hash", lambda: None)() or "none"))
    prompts = check_prompts(target, opts)
    rec, answers, runs = run_greedy(target, drafter, prompts, opts, card)
    law_rec = check_law(target, drafter, cls, law_prompt(target, prompts, answers), opts, card)
    check_trees([rec, law_rec], target, budget, card)
    if rec.proposals and rec.error is None:
        check_protocol(target, drafter, rec, prompts, opts, card)
        check_checkpoint(cls, target, drafter, overrides, rec, card)
    else:
        card.add("protocol", "skip", "no complete answer to resume")
    timing_row(runs, card)
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
