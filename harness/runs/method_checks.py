"""The checks of `cli.py check-method` (harness/runs/check_method.py builds the drafter, picks the
prompts, runs these in order and prints the card): each runs the drafter through the harness's own
loop (harness/core/decode.py) and adds one row to the `Card`, naming the rule it breaks:
  config       its config keys: JSON values, architecture keys among them, an unknown key refused,
               its tree budget (`budget_overrides`) in its own keys
  greedy       output token-exact with AR on a few prompts of every benchmark (the tiny target:
               random token prompts), at the large budget and (first prompt of each) the small one
  budget       every tree within the budget it was given (DraftContext.budget, and through
               `budget_overrides` where the class has one), at a small and a large budget
  edge cases   one-token and few-token prompts, the context limit, EOS at once and in the first
               step, token limits 1 and 2 (harness/runs/edge_cases.py)
  q            drafts drawn from the q their tree reports, or the same tree at every draw when it
               reports none, at T = 0.5, 1 and 1.5 from fixed states (harness/runs/q_check.py)
  law          at T > 0 every token of the first speculative step follows AR's law, on the context
               and temperature where the drafter's drafts are accepted most (harness/runs/law_search.py)
  tree         every proposal keeps the tree contract (tree_contract.py): root, parents before
               children, tokens, depths, the answer's room, q rows
  protocol     begin / propose / observe in order survive a resumed answer: a proposal reached
               through observe equals (or nests with) the one a fresh `begin` on the same context
               gives, and a second answer after those resumptions proposes as the first did (a
               drafter that declares `resumable = False`, whose proposals rest on what earlier
               forwards computed, is held to the second answer only)
  checkpoint   trainable methods: save_pretrained then from_pretrained proposes the same trees
  timing       draft ms per new token against the AR step, on the greedy prompts
A `Recorder` wraps the drafter so the checks read its proposals after the loop, never while its
clock runs.
"""
from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core.decode import DraftContext, Generation, GenerationConfig, drafting_weights, generate, prefill
from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.core.rules import RULES
from harness.core.verify import Sampling
from harness.runs.metrics import first_divergence
from harness.runs.tree_contract import nested, same_tree, token_paths, tree_violations

GREEDY = Sampling()
PROTOCOL_AGREEMENT = 0.9  # resumed proposals that must nest with the running ones (float noise flips near ties)
SMALL_BUDGET = 4          # the small of the two budgets every drafter is held to
DRAFT_WARN, DRAFT_FAIL = 0.5, 1.0   # draft ms per new token, as a fraction of the AR step
STEP_FLOOR_MS = 10.0      # a shorter AR step (the tiny target's) is judged as this long
TITLES = {"config": "config keys", "greedy": "greedy = AR", "budget": "tree budget", "edge": "edge cases",
          "q": "draft law q", "law": "law at T>0", "tree": "tree contract", "protocol": "begin/propose/observe",
          "checkpoint": "checkpoint round trip", "timing": "draft time"}


@dataclass
class CheckOptions:
    target: str = "smollm2-135m"
    dtype: str = "float32"
    device: str = "cpu"
    data_dir: str | Path | None = None
    prompts: int = 2               # per benchmark (the tiny target: this many random prompts per benchmark)
    max_new_tokens: int = 48
    law_samples: int = 1000
    q_draws: int = 64              # proposals per state and temperature of a drafter that reports q
    tree_budget: int | str | None = 15   # the large budget ("auto" / None: sized as configured)
    settings: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    random_init: bool | None = None  # None: on the tiny target only (no weights exist for it)
    resumes: int = 6               # resumed answers compared per prompt
    seed: int = 0


@dataclass
class CheckResult:
    rule: str
    status: str   # pass | fail | warn (passes, with a caveat) | skip | info
    detail: str

    @property
    def title(self) -> str:
        return TITLES.get(self.rule, self.rule)


@dataclass
class Card:
    method: str
    info: Any
    target: str
    dtype: str
    config: dict[str, Any]
    weights: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(r.status == "fail" for r in self.results)

    def add(self, rule: str, status: str, detail: str) -> None:
        self.results.append(CheckResult(rule, status, detail))


@dataclass
class Subject:
    """The drafter under test at one budget: `budget` is every proposal's DraftContext.budget
    (None: sized as configured), `channel` says how the budget reached it."""

    drafter: Any
    budget: int | None
    channel: str

    def config(self, max_new_tokens: int, **kw) -> GenerationConfig:
        return GenerationConfig(max_new_tokens, tree_budget=self.budget, **kw)


@dataclass
class Proposal:
    tokens: list[int]   # the committed context, root last
    max_nodes: int
    tree: Any
    budget: int | None = None
    accepted: int = -1  # drafts the verify accepted (-1: not observed, the answer ended there)

    @property
    def root(self) -> int:
        return self.tokens[-1]


class Recorder:
    """The drafter as the loop sees it, keeping each proposal's context, budget, tree and accepted
    count (and what raised, in which call) for the checks afterwards: nothing is checked while the
    loop's clock runs."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.proposals: list[Proposal] = []
        self.error: tuple[str, Exception] | None = None

    def _call(self, where: str, fn, *args):
        try:
            return fn(*args)
        except Exception as e:
            self.error = (where, e)
            raise

    def begin(self, prompt, prefill_out, root: int) -> None:
        self._call("begin", self.drafter.begin, prompt, prefill_out, root)

    def propose(self, ctx: DraftContext):
        tokens = list(ctx.tokens)
        tree = self._call("propose", self.drafter.propose, ctx)
        self.proposals.append(Proposal(tokens, ctx.max_nodes, tree, ctx.budget))
        return tree

    def observe(self, step) -> None:
        if self.proposals:
            self.proposals[-1].accepted = step.accepted
        self._call("observe", self.drafter.observe, step)

    def __getattr__(self, name: str):
        # what the loop reads off a drafter besides the protocol (its config, target layers)
        return getattr(self.__dict__["drafter"], name)


def raised(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


# ----------------------------------------------------------------------------- config

def check_config(cls: type, card: Card) -> None:
    """Static: what the runner, the config hash and the records need of the declared keys."""
    problems = []
    if not isinstance(cls.name, str) or not cls.name:
        problems.append("the class declares no `name`")
    try:
        json.dumps(cls.defaults)
    except TypeError as e:
        problems.append(f"defaults are not JSON values ({e}): records and config hashes need them")
    stray = [k for k in cls.arch_keys if k not in cls.defaults]
    if stray:
        problems.append(f"arch_keys {stray} are not config keys")
    rules = [r for r in cls.acceptance_rules if r not in RULES]
    if rules or "greedy" not in cls.acceptance_rules:
        problems.append(f"acceptance_rules {list(cls.acceptance_rules)}: must include greedy, drawn from {list(RULES)}")
    try:
        cls.resolve_config({"__no_such_key__": 1})
        problems.append("an unknown config key is accepted (resolve_config must raise SpecbenchError)")
    except SpecbenchError:
        pass
    budget_keys = [k for k in cls.budget_overrides(8) if k not in cls.defaults]
    if budget_keys:
        problems.append(f"budget_overrides sets {budget_keys}, not config keys")
    if problems:
        card.add("config", "fail", "; ".join(problems))
    else:
        arch = f" ({len(cls.arch_keys)} architecture: {', '.join(cls.arch_keys)})" if cls.arch_keys else ""
        card.add("config", "pass", f"{len(cls.defaults)} keys{arch}; an unknown key is refused")


# ----------------------------------------------------------------------------- greedy

@dataclass
class GreedyRun:
    """Greedy answers of one budget beside AR's: the drafter's proposals, the Generations (the
    timing row reads them), the problems found."""

    rec: Recorder
    budget: int | None
    prompts: int = 0
    steps: int = 0
    tokens: int = 0
    runs: list[tuple[str, Generation]] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.crashes + self.diverged


def ar_answers(target: Target, prompts, opts: CheckOptions) -> dict[str, Generation]:
    """AR's greedy answer to each prompt, with the logit gaps that tell a near tie from a real mismatch."""
    return {label: generate(target, p, GenerationConfig(opts.max_new_tokens, record_logit_gaps=True))
            for label, p in prompts}


def run_greedy(target: Target, subject: Subject, prompts, ar: dict[str, Generation], opts: CheckOptions) -> GreedyRun:
    """The drafter's greedy answers to `prompts` at its budget, each against AR's."""
    run = GreedyRun(Recorder(subject.drafter), subject.budget, len(prompts))
    for label, p in prompts:
        run.runs.append(("ar", ar[label]))
        try:
            sp = generate(target, p, subject.config(opts.max_new_tokens), run.rec)
        except Exception as e:  # noqa: BLE001 - a drafter's crash is a finding, reported by rule
            run.crashes.append(f"{label}: the run raised {raised(e)}")
            continue
        run.runs.append(("drafter", sp))
        run.steps += len(sp.tokens)
        run.tokens += len(sp.output_ids)
        a = ar[label]
        div = first_divergence(sp.output_ids, a.output_ids, a.top1, a.gap, False)
        if div is not None:
            gap = "" if div.get("gap") is None else f" (AR top-2 gap {div['gap']:.2g})"
            run.diverged.append(f"{label}: differs from AR at token {div['position']}{gap}")
    return run


def greedy_row(large: GreedyRun, small: GreedyRun | None, card: Card) -> None:
    runs = [r for r in (large, small) if r is not None]
    bad = [r for r in runs if r.problems]
    if bad:
        r = bad[0]
        card.add("greedy", "fail", f"{len(r.diverged)} of {r.prompts} answers at budget {r.budget} differ from AR"
                 f"{', ' + str(len(r.crashes)) + ' raised' if r.crashes else ''}: {r.problems[0]}")
        return
    what = "; ".join(f"{r.prompts} prompts at budget {r.budget}: {r.tokens} tokens in {r.steps} steps "
                     f"({r.tokens / max(1, r.steps):.2f} per verify)" for r in runs)
    card.add("greedy", "pass", f"token-exact on {what}")


# ----------------------------------------------------------------------------- budget, trees

def check_budget(recorders: list[Recorder], subjects: list[Subject], card: Card) -> None:
    """Every recorded tree within the DraftContext.budget it was proposed under."""
    trees = [pr for r in recorders for pr in r.proposals if pr.budget is not None]
    over = [pr for pr in trees if pr.tree.size > pr.budget]
    channels = {s.budget: s.channel for s in subjects if s.budget is not None}
    if over:
        pr = max(over, key=lambda x: x.tree.size - x.budget)
        card.add("budget", "fail", f"budget: a tree of {pr.tree.size} draft nodes at a budget of {pr.budget}, "
                 f"given {channels.get(pr.budget, 'as DraftContext.budget')} [{len(over)} of {len(trees)} trees over]")
    elif not channels:
        card.add("budget", "fail", "budget: no budget was given (--tree-budget none/auto and no small budget)")
    else:
        sizes = {b: max((pr.tree.size for pr in trees if pr.budget == b), default=0) for b in sorted(channels)}
        card.add("budget", "pass", "; ".join(f"budget {b}, {channels[b]}: trees of at most {n} draft nodes"
                                             for b, n in sizes.items()))


def check_trees(recorders: list[Recorder], target: Target, card: Card) -> None:
    """The tree contract on every recorded proposal (the budget has its own row)."""
    trees = [pr for r in recorders if r is not None for pr in r.proposals]
    errors = [r.error for r in recorders if r is not None and r.error is not None and r.error[0] == "propose"]
    broken: dict[str, tuple[str, int]] = {}
    for pr in trees:
        for v in tree_violations(pr.tree, pr.root, pr.max_nodes, target.vocab_size):
            rule = v.split(":", 1)[0]
            first, n = broken.get(rule, (v, 0))
            broken[rule] = (first, n + 1)
    if errors:
        _, e = errors[0]
        card.add("tree", "fail", f"propose raised {raised(e)}")
    elif broken:
        card.add("tree", "fail", "; ".join(f"{v} [{n} of {len(trees)} trees]" for v, n in broken.values()))
    elif not trees:
        card.add("tree", "fail", "no proposal was made")
    else:
        sizes = [pr.tree.size for pr in trees]
        card.add("tree", "pass", f"{len(trees)} trees of {min(sizes)}-{max(sizes)} draft nodes: root, parents "
                 "before children, tokens, depths, room" + (", q rows" if any(pr.tree.q is not None for pr in trees) else ""))


# ----------------------------------------------------------------------------- edge cases

def check_edges(target: Target, subject: Subject, base: list[int], ar_first: list[int], card: Card) -> Recorder:
    from harness.runs.edge_cases import edge_cases, run_case

    rec = Recorder(subject.drafter)
    cases = edge_cases(target, base, ar_first)
    failed = []
    for case in cases:
        rec.error = None
        problem = run_case(target, rec, case, subject.budget)
        if problem:
            where = f" in {rec.error[0]}" if rec.error is not None else ""
            failed.append(f"{case.name}: raised{where} {problem}" if rec.error is not None else f"{case.name}: {problem}")
    rec.error = None  # reported here, not again as a tree finding
    if failed:
        card.add("edge", "fail", f"{len(failed)} of {len(cases)} cases: " + "; ".join(failed))
    else:
        card.add("edge", "pass", f"{len(cases)} cases answered as AR: " + ", ".join(c.name for c in cases))
    return rec


# ----------------------------------------------------------------------------- the draft law q, the output law

def lossless_declared(cls: type, rule: str, card: Card) -> bool:
    if "lossless" in cls.acceptance_rules:
        return True
    card.add(rule, "skip", f"the method declares acceptance rules {', '.join(cls.acceptance_rules)}: run, compare "
             "and ablate refuse it at T > 0")
    return False


def check_q(target: Target, subject: Subject, cls: type, contexts: list[list[int]], opts: CheckOptions,
            card: Card) -> Recorder | None:
    from harness.runs.q_check import draw, verdict

    if not lossless_declared(cls, "q", card):
        return None
    if not contexts:
        card.add("q", "fail", "draft law: no drafter state to draw from (no greedy proposal was made)")
        return None
    rec = Recorder(subject.drafter)
    try:
        found = draw(target, rec, contexts, opts.q_draws, subject.budget, opts.seed)
    except Exception as e:  # noqa: BLE001 - reported by rule
        card.add("q", "fail", f"draft law: proposing at T > 0 raised {raised(e)}")
        rec.error = None  # reported here, not again as a tree finding
        return rec
    card.add("q", *verdict(found))
    return rec


def check_law(target: Target, subject: Subject, cls: type, candidates, opts: CheckOptions, card: Card) -> Recorder | None:
    from harness.runs.law_search import law_verdict, search_and_sample

    if not lossless_declared(cls, "law", card):
        return None
    if not candidates:
        card.add("law", "fail", "lossless: no context to sample from (no greedy proposal was made)")
        return None
    rec = Recorder(subject.drafter)
    try:
        found = search_and_sample(target, rec, candidates, opts.law_samples, subject.budget)
    except Exception as e:  # noqa: BLE001 - reported by rule
        card.add("law", "fail", f"lossless: sampling raised {raised(e)}")
        rec.error = None
        return rec
    card.add("law", *law_verdict(found, getattr(subject.drafter, "resumable", True)))
    return rec


# ----------------------------------------------------------------------------- resumed answers, checkpoints

@torch.inference_mode()
def propose_fresh(target: Target, drafter, pr: Proposal):
    """A resumed answer: `begin` on the proposal's context (its root last) as a new sequence, then
    one `propose`; None when the prefill's argmax is not that root (a near tie decided otherwise)."""
    prompt = pr.tokens[:-1]
    _, _, root = prefill(target, prompt, GenerationConfig(max(1, pr.max_nodes)), None, drafter)
    if root != pr.root:
        return None
    with drafting_weights(drafter):
        return drafter.propose(DraftContext(list(pr.tokens), pr.root, GREEDY, None, pr.max_nodes, pr.budget))


def split_by_prompt(proposals: list[Proposal], prompts) -> list[list[Proposal]]:
    """The recorded proposals back into answers, in prompt order (each context starts with its prompt)."""
    out, i = [], 0
    for _, p in prompts:
        mine = []
        while i < len(proposals) and proposals[i].tokens[:len(p)] == p:
            mine.append(proposals[i])
            i += 1
        out.append(mine)
    return out


def check_protocol(target: Target, subject: Subject, rec: Recorder, prompts, opts: CheckOptions, card: Card) -> None:
    """Resume answers mid-way and compare proposals; then answer the first prompt again.

    Where both the running and the resumed drafter propose something, the trees must nest (the
    same proposal, up to what a history-sized budget kept: pld's adaptive chain length); a step
    where only one of them proposes anything says nothing either way and is counted apart."""
    drafter = subject.drafter
    by_prompt = split_by_prompt(rec.proposals, prompts)
    compared = agreed = one_empty = ties = 0
    first_miss = ""
    resumable = getattr(drafter, "resumable", True)
    for (label, p), props in zip(prompts if resumable else [], by_prompt):
        picks = props[1:][:: max(1, math.ceil((len(props) - 1) / max(1, opts.resumes)))][: opts.resumes]
        for pr in picks:
            if token_paths(pr.tree) is None:
                continue  # an invalid tree is the tree check's finding, not a protocol one
            try:
                again = propose_fresh(target, drafter, pr)
            except Exception as e:  # noqa: BLE001 - reported by rule
                card.add("protocol", "fail", f"a resumed answer ({label}) raised {raised(e)}")
                return
            if again is None:
                ties += 1
            elif pr.tree.size and again.size:
                compared += 1
                if nested(pr.tree, again):
                    agreed += 1
                elif not first_miss:
                    first_miss = (f"{label}, answer token {len(pr.tokens) - len(p)}: after observe "
                                  f"{pr.tree.tokens[1:].tolist()[:6]}, resumed {again.tokens[1:].tolist()[:6]}")
            elif pr.tree.size or again.size:
                one_empty += 1
    label, p = prompts[0]
    second = Recorder(drafter)
    generate(target, p, subject.config(opts.max_new_tokens), second)
    repeat = len(second.proposals) == len(by_prompt[0]) and all(
        same_tree(a.tree, b.tree) for a, b in zip(second.proposals, by_prompt[0]))
    resumed = f"{agreed} of {compared} resumed answers propose what observe led to" + (
        f" ({one_empty} where only one side proposed)" if one_empty else "") + (
        f" ({ties} skipped: near ties)" if ties else "")
    if compared and agreed < PROTOCOL_AGREEMENT * compared:
        card.add("protocol", "fail", f"a proposal ignores what observe told it: {resumed}; e.g. {first_miss}")
    elif not repeat:
        card.add("protocol", "fail", f"a second answer to '{label}' after the resumed ones proposes other trees "
                 "than the first: begin does not reset the drafter's state")
    elif not resumable:
        card.add("protocol", "pass", "a repeated answer proposes the same trees (no resumed answer compared: "
                 "its proposals rest on earlier forwards, `resumable = False`)")
    elif not compared:
        card.add("protocol", "warn", f"not exercised: {resumed}")
    else:
        card.add("protocol", "pass", f"{resumed}; a repeated answer proposes the same trees")


def check_checkpoint(cls: type, target: Target, subject: Subject, rec: Recorder, card: Card) -> None:
    """save_pretrained, from_pretrained, and the same trees on a few resumed contexts."""
    drafter = subject.drafter
    if not cls.trainable:
        card.add("checkpoint", "skip", "training-free: no weights to save")
        return
    if not (hasattr(drafter, "save_pretrained") and hasattr(cls, "from_pretrained")):
        card.add("checkpoint", "fail", "trainable, but has no save_pretrained / from_pretrained")
        return
    note = ""
    with torch.no_grad():  # the checkpoint stores floats as bf16: compare weights it can hold
        for p in drafter.parameters():
            if p.is_floating_point() and not torch.equal(p, p.to(torch.bfloat16).to(p.dtype)):
                note = "; weights rounded to bf16 (the checkpoint's storage) first"
                p.copy_(p.to(torch.bfloat16).to(p.dtype))
    picks = rec.proposals[:: max(1, len(rec.proposals) // 4)][:4]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            drafter.save_pretrained(tmp)
            # configured as the saved one is: its inference keys (Medusa's fitted tree candidates
            # among them) are not part of a checkpoint it writes
            loaded = cls.from_pretrained(tmp, target, dict(drafter.config))
            pairs = [(propose_fresh(target, drafter, pr), propose_fresh(target, loaded, pr)) for pr in picks]
    except Exception as e:  # noqa: BLE001 - reported by rule
        card.add("checkpoint", "fail", f"save then load raised {raised(e)}")
        return
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    same = sum(same_tree(a, b) for a, b in pairs)
    if same < len(pairs) or not pairs:
        card.add("checkpoint", "fail", f"the loaded drafter proposes other trees: {same} of {len(pairs)} the same{note}")
    else:
        card.add("checkpoint", "pass", f"save then load: the same trees on {len(pairs)} contexts{note}")


# ----------------------------------------------------------------------------- draft time

def timing_row(runs: list[tuple[str, Generation]], card: Card) -> None:
    """Draft ms (propose + observe) per new token against the AR step of the same prompts: above
    DRAFT_FAIL the drafting alone costs more per token than AR does, so no verify could make the
    method faster than the target it accelerates. An AR step shorter than STEP_FLOOR_MS (the tiny
    target's) measures the Python around a forward, not the model, and is judged as that long."""
    from harness.core.hardware import cpu_kind

    mine = [g for kind, g in runs if kind == "drafter"]
    draft = [ms for g in mine for ms in g.draft_ms]
    ar = [ms for kind, g in runs if kind == "ar" for ms in g.verify_ms]
    tokens = sum(len(g.output_ids) for g in mine)
    if not draft or not ar or not tokens:
        card.add("timing", "info", "no steps timed")
        return
    per_step, per_token, step = sum(draft) / len(draft), sum(draft) / tokens, sum(ar) / len(ar)
    judged = max(step, STEP_FLOOR_MS)
    ratio = per_token / judged
    floor = f", judged as {STEP_FLOOR_MS:g} ms: a shorter step times the Python, not the model" if step < STEP_FLOOR_MS else ""
    what = (f"draft {per_step:.2f} ms per step, {per_token:.2f} ms per new token = {ratio:.2f} of an AR step "
            f"({step:.2f} ms{floor}), {len(draft)} steps on {cpu_kind()}")
    if ratio > DRAFT_FAIL:
        card.add("timing", "fail", f"slower than the target: {what}; drafting alone costs more per token than AR")
    elif ratio > DRAFT_WARN:
        card.add("timing", "warn", f"{what}: above {DRAFT_WARN} of an AR step, little room for a speedup")
    else:
        card.add("timing", "pass", f"{what}; for figures, time with `cli.py run` on an idle machine")
