"""The checks of `cli.py check-method` (harness/runs/check_method.py builds the drafter, picks the
prompts, runs these in order and prints the card): each runs the drafter through the harness's own
loop (harness/core/decode.py) and adds one row to the `Card`, naming the rule it breaks:
  config       its config keys: JSON values, architecture keys among them, an unknown key refused,
               its tree budget (`budget_overrides`) in its own keys
  greedy       output token-exact with AR on a few prompts of every benchmark (the tiny target:
               random token prompts)
  law          at T = 1 the first two tokens follow AR's exact law (chi-square; law_sampling.py)
  tree         every proposal keeps the tree contract (tree_contract.py): root, parents before
               children, depths, the answer's room and the tree budget, q rows
  protocol     begin / propose / observe in order survive a resumed answer: a proposal reached
               through observe equals (or nests with) the one a fresh `begin` on the same context
               gives, and a second answer after those resumptions proposes as the first did (a
               drafter that declares `resumable = False`, whose proposals rest on what earlier
               forwards computed, is held to the second answer only)
  checkpoint   trainable methods: save_pretrained then from_pretrained proposes the same trees
  timing       draft ms per step against the AR step (information: seconds never fail a check)
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
from harness.core.verify import RULES, Sampling
from harness.runs.law_sampling import ALPHA_FAIR, ForwardReplay, RootMemo, exact_law, law_fit, sample_counts
from harness.runs.metrics import first_divergence
from harness.runs.tree_contract import nested, same_tree, token_paths, tree_violations

GREEDY = Sampling()
EXERCISED = 0.1       # the law check says "weakly exercised" below this share of samples accepting a draft
PROTOCOL_AGREEMENT = 0.9  # resumed proposals that must nest with the running ones (float noise flips near ties)
TITLES = {"config": "config keys", "greedy": "greedy = AR", "law": "law at T=1", "tree": "tree contract",
          "protocol": "begin/propose/observe", "checkpoint": "checkpoint round trip", "timing": "draft time"}


@dataclass
class CheckOptions:
    target: str = "smollm2-135m"
    dtype: str = "float32"
    device: str = "cpu"
    data_dir: str | Path | None = None
    prompts: int = 2               # per benchmark (the tiny target: this many random prompts per benchmark)
    max_new_tokens: int = 48
    law_samples: int = 2000
    law_temperature: float = 1.0
    tree_budget: int | str | None = 15
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
class Proposal:
    tokens: list[int]   # the committed context, root last
    max_nodes: int
    tree: Any

    @property
    def root(self) -> int:
        return self.tokens[-1]


class Recorder:
    """The drafter as the loop sees it, keeping each proposal's context and tree (and what `propose`
    raised) for the checks afterwards: nothing is checked while the loop's clock runs."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.proposals: list[Proposal] = []
        self.error: tuple[list[int], Exception] | None = None

    def begin(self, prompt, prefill_out, root: int) -> None:
        self.drafter.begin(prompt, prefill_out, root)

    def propose(self, ctx: DraftContext):
        tokens = list(ctx.tokens)
        try:
            tree = self.drafter.propose(ctx)
        except Exception as e:
            self.error = (tokens, e)
            raise
        self.proposals.append(Proposal(tokens, ctx.max_nodes, tree))
        return tree

    def observe(self, step) -> None:
        self.drafter.observe(step)

    def __getattr__(self, name: str):
        # what the loop reads off a drafter besides the protocol (its config, target layers)
        return getattr(self.__dict__["drafter"], name)


# ----------------------------------------------------------------------------- the checks

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


def run_greedy(target: Target, drafter, prompts, opts: CheckOptions, card: Card) -> tuple[Recorder, dict, list]:
    """Greedy answers with the drafter and with AR; returns the recorder, the AR answers by prompt
    label and the drafter's Generations (for the timing row)."""
    rec = Recorder(drafter)
    answers, runs, diverged, raised = {}, [], [], []
    steps = tokens = 0
    for label, p in prompts:
        ar = generate(target, p, GenerationConfig(opts.max_new_tokens, record_logit_gaps=True))
        answers[label] = ar.output_ids
        runs.append(("ar", ar))
        try:
            sp = generate(target, p, GenerationConfig(opts.max_new_tokens), rec)
        except Exception as e:  # noqa: BLE001 - a drafter's crash is a finding, reported by rule
            raised.append(f"{label}: the run raised {type(e).__name__}: {e}")
            continue
        runs.append(("drafter", sp))
        steps += len(sp.tokens)
        tokens += len(sp.output_ids)
        div = first_divergence(sp.output_ids, ar.output_ids, ar.top1, ar.gap, False)
        if div is not None:
            gap = "" if div.get("gap") is None else f" (AR top-2 gap {div['gap']:.2g})"
            diverged.append(f"{label}: differs from AR at token {div['position']}{gap}")
    if raised or diverged:
        card.add("greedy", "fail", f"{len(diverged)} of {len(prompts)} answers differ from AR"
                 f"{', ' + str(len(raised)) + ' raised' if raised else ''}: {(raised + diverged)[0]}")
    else:
        card.add("greedy", "pass", f"token-exact on {len(prompts)} prompts, {tokens} tokens in {steps} steps "
                 f"({tokens / max(1, steps):.2f} tokens per verify)")
    return rec, answers, runs


def check_law(target: Target, drafter, cls: type, prompt: tuple[str, list[int]], opts: CheckOptions,
              card: Card) -> Recorder | None:
    """At T = 1 the first two tokens of an answer follow AR's exact law (chi-square, p > ALPHA_FAIR)."""
    if "lossless" not in cls.acceptance_rules:
        card.add("law", "skip", "the method declares no lossless rule")
        return None
    label, ids = prompt
    t = opts.law_temperature
    law = exact_law(target, ids, t, 1.0)
    rec = Recorder(drafter)
    memo = RootMemo(rec)
    target.forward = ForwardReplay(target, ids)   # memoised per distinct input: the samples differ only in their draws
    try:
        counts, accepted = sample_counts(target, ids, memo, Sampling(t, 1.0, "lossless"), opts.law_samples)
    except Exception as e:  # noqa: BLE001 - reported by rule
        card.add("law", "fail", f"sampling raised {type(e).__name__}: {e}")
        return rec
    finally:
        del target.forward  # back to the class's method
    stat, df, p = law_fit(counts, law, opts.law_samples)
    what = (f"chi2 {stat:.1f} on {df} df, p = {p:.3g} over {opts.law_samples} samples ({label}); "
            f"a draft accepted in {accepted / opts.law_samples:.0%} of them")
    if not p > ALPHA_FAIR:
        card.add("law", "fail", f"lossless: the first two tokens do not follow AR's law: {what}")
    elif accepted < EXERCISED * opts.law_samples:
        card.add("law", "warn", f"{what}: weakly exercised")
    else:
        card.add("law", "pass", what)
    return rec


def check_trees(recorders: list[Recorder], target: Target, budget: int | None, card: Card) -> None:
    trees = [pr for r in recorders if r is not None for pr in r.proposals]
    errors = [r.error for r in recorders if r is not None and r.error is not None]
    broken: dict[str, tuple[str, int]] = {}
    for i, pr in enumerate(trees):
        for v in tree_violations(pr.tree, pr.root, pr.max_nodes, target.vocab_size, budget):
            rule = v.split(":", 1)[0]
            first, n = broken.get(rule, (v, 0))
            broken[rule] = (first, n + 1)
    if errors:
        _, e = errors[0]
        card.add("tree", "fail", f"propose raised {type(e).__name__}: {e}")
    elif broken:
        card.add("tree", "fail", "; ".join(f"{v} [{n} of {len(trees)} trees]" for v, n in broken.values()))
    elif not trees:
        card.add("tree", "fail", "no proposal was made")
    else:
        sizes = [pr.tree.size for pr in trees]
        limit = f", within the tree budget of {budget}" if budget is not None else " (no tree budget applied)"
        card.add("tree", "pass", f"{len(trees)} trees of {min(sizes)}-{max(sizes)} draft nodes: root, parents "
                 f"before children, depths, room{limit}" + (", q rows" if any(pr.tree.q is not None for pr in trees) else ""))


@torch.inference_mode()
def propose_fresh(target: Target, drafter, pr: Proposal):
    """A resumed answer: `begin` on the proposal's context (its root last) as a new sequence, then
    one `propose`; None when the prefill's argmax is not that root (a near tie decided otherwise)."""
    prompt = pr.tokens[:-1]
    _, _, root = prefill(target, prompt, GenerationConfig(max(1, pr.max_nodes)), None, drafter)
    if root != pr.root:
        return None
    with drafting_weights(drafter):
        return drafter.propose(DraftContext(list(pr.tokens), pr.root, GREEDY, None, pr.max_nodes))


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


def check_protocol(target: Target, drafter, rec: Recorder, prompts, opts: CheckOptions, card: Card) -> None:
    """Resume answers mid-way and compare proposals; then answer the first prompt again.

    Where both the running and the resumed drafter propose something, the trees must nest (the
    same proposal, up to what a history-sized budget kept: pld's adaptive chain length); a step
    where only one of them proposes anything says nothing either way and is counted apart."""
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
                card.add("protocol", "fail", f"a resumed answer ({label}) raised {type(e).__name__}: {e}")
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
    generate(target, p, GenerationConfig(opts.max_new_tokens), second)
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


def check_checkpoint(cls: type, target: Target, drafter, overrides: dict[str, Any], rec: Recorder, card: Card) -> None:
    """save_pretrained, from_pretrained, and the same trees on a few resumed contexts."""
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
            loaded = cls.from_pretrained(tmp, target, overrides)
            pairs = [(propose_fresh(target, drafter, pr), propose_fresh(target, loaded, pr)) for pr in picks]
    except Exception as e:  # noqa: BLE001 - reported by rule
        card.add("checkpoint", "fail", f"save then load raised {type(e).__name__}: {e}")
        return
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    same = sum(same_tree(a, b) for a, b in pairs)
    if same < len(pairs) or not pairs:
        card.add("checkpoint", "fail", f"the loaded drafter proposes other trees: {same} of {len(pairs)} the same{note}")
    else:
        card.add("checkpoint", "pass", f"save then load: the same trees on {len(pairs)} contexts{note}")


def timing_row(runs: list[tuple[str, Generation]], card: Card) -> None:
    """Draft ms per step against the AR step of the same prompts (information only)."""
    from harness.core.hardware import cpu_kind

    draft = [ms for kind, g in runs if kind == "drafter" for ms in g.draft_ms]
    ar = [ms for kind, g in runs if kind == "ar" for ms in g.verify_ms]
    if not draft or not ar:
        card.add("timing", "info", "no steps timed")
        return
    d, a = sum(draft) / len(draft), sum(ar) / len(ar)
    card.add("timing", "info", f"draft {d:.2f} ms per step = {d / a:.2f} of an AR step ({a:.2f} ms), "
             f"{len(draft)} steps on {cpu_kind()}; for figures, time with `cli.py run` on an idle machine")
