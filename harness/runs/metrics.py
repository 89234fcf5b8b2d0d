"""Metrics of answer records (`harness.runs.record.Record`: its fields, and what older files hold),
defined once: τ, speedup, per-depth acceptance and tokens per verify as named ratio-of-sums
metrics with their bootstrap intervals; summary.csv; each greedy answer's divergence from AR.

Every metric is a `RatioOfSums`: each answer gives a numerator and a denominator (`terms`) and
the metric is Σ numerators / Σ denominators over the answers, never a mean of per-answer ratios,
so a long answer weighs what it weighs in the user's wait:
- `TAU` = Σ new tokens / Σ verify steps (prefill excluded, bonus token included, tokens after
  EOS or the limit trimmed). AR yields one token per step, so its τ is exactly 1.
- `SPEEDUP` (paired) = (Σ new_tokens / Σ wall_s of the method) / (Σ new_tokens / Σ wall_s of AR)
  over the same prompts (`Record.prompt`) of the same records, paired regardless of acceptance: a
  ratio of throughputs, not a mean of per-question ratios.
- `depth_acceptance(d)` = verify steps that accepted at least d drafts / verify steps.
- `TOKENS_PER_VERIFY` = Σ draft tokens verified (tree nodes under the root) / Σ verify steps.
A metric's 95% interval is a percentile bootstrap over answers (`RatioOfSums.replicates`;
`N_BOOTSTRAP` resamples seeded from the metric's name and the cell, so a rebuild gives identical
files). summary.csv (`summarize`, here), the tables and plots (harness/report/) and the τ
baselines (harness/runs/regress.py) take their numbers from these definitions, and `cli.py
bench` its τ.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.core.files import write_atomic
from harness.runs.record import AR_METHOD, Record

N_BOOTSTRAP = 2000
CI_LEVEL = 0.95
SUMMARY_COLUMNS = [
    "method", "benchmark", "temperature", "acceptance", "answers", "new_tokens", "tau", "speedup",
    "tokens_per_s", "ar_tokens_per_s", "draft_ms_per_step", "verify_ms_per_step", "mismatches",
    "mismatches_near_tie", "other_cpu_cores",
]
# Decimals kept in summary.csv: ratios need 4 to show regressions; seconds-derived figures are
# noisy beyond 2.
ROUNDING = {
    "tau": 4, "speedup": 4, "tokens_per_s": 2, "ar_tokens_per_s": 2,
    "draft_ms_per_step": 2, "verify_ms_per_step": 2, "other_cpu_cores": 2,
}
ByPrompt = Mapping[tuple, Sequence[Record]]


# ----------------------------------------------------------------------------- per-answer terms

def tokens_and_steps(rec: Record) -> tuple[int, int]:
    """(Σ tokens over verify steps, number of verify steps) of one answer.

    An AR record that logs no steps counts one step per token not produced by the prefill, which
    is what AR does; a drafter record without steps counts nothing.
    """
    tokens = rec.steps.tokens
    if tokens is not None:
        return int(sum(tokens)), len(tokens)
    if rec.is_ar:
        n = int(rec.new_tokens) - int(bool(rec.first_token_from_prefill))
        return max(n, 0), max(n, 0)
    return 0, 0


def dedupe(records: Iterable[Record]) -> list[Record]:
    """One record per key, the last one winning: records merged from resumed or parallel runs
    may repeat an answer, and counting it twice would skew every sum."""
    by_key: dict[str, Record] = {}
    for rec in records:
        by_key[rec.key] = rec  # keeps the first occurrence's place, so row order is unchanged
    return list(by_key.values())


def ar_by_prompt(records: Iterable[Record]) -> dict[tuple, list[Record]]:
    """AR's answers by `Record.prompt`: what a method's answer is paired with for its speedup."""
    out: dict[tuple, list[Record]] = {}
    for rec in records:
        if rec.is_ar:
            out.setdefault(rec.prompt, []).append(rec)
    return out


# ----------------------------------------------------------------------------- ratio-of-sums metrics

def _ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, NaN where den is 0 (a resample may draw no verify step)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def column_sums(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Σ of each column of `rows` [answers, k]: [k]; with `weights` [resamples, answers] (a
    bootstrap's draw counts), [resamples, k]."""
    # Column by column (numpy's pairwise sum): the order the committed tables were summed in, so
    # a rebuild matches them to the last digit; a bootstrap sums each resample by matmul.
    if weights is None:
        return np.array([rows[:, j].sum() for j in range(rows.shape[1])])
    return weights @ rows


def seed_of(*parts: Any) -> int:
    """A bootstrap seed from a cell's identity: the same cell resamples alike in every rebuild."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def bootstrap_weights(n: int, seed: int, resamples: int) -> np.ndarray:
    """[resamples, n] counts of each answer in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)


def interval(reps: np.ndarray | None) -> tuple[float, float]:
    """The `CI_LEVEL` percentile interval of bootstrap replicates; NaNs without any finite one."""
    if reps is None or not np.isfinite(reps).any():
        return math.nan, math.nan
    lo, hi = np.nanpercentile(reps, [50 * (1 - CI_LEVEL), 100 - 50 * (1 - CI_LEVEL)])
    return float(lo), float(hi)


@dataclass(frozen=True)
class RatioOfSums:
    """A metric Σ numerator / Σ denominator over answers, each answer giving `terms(record)`.

    `paired`: the method's ratio over AR's on the same prompts, (Σ num / Σ den) / (Σ AR num /
    Σ AR den), over the answers that have an AR answer to their prompt. An AR answer shared by k
    answers of the set (variants of one method pooled in one summary.csv row) is split k ways, so it
    counts once, as AR answered it once.
    """

    name: str
    terms: Callable[[Record], tuple[float, float]]
    paired: bool = False

    def rows(self, records: Sequence[Record], ar: ByPrompt | None = None) -> np.ndarray:
        """Each answer's terms: [answers, 2]; paired: [answers with an AR pair, 4], AR's share after."""
        if not self.paired:
            return np.array([self.terms(r) for r in records], dtype=float).reshape(-1, 2)
        ar = ar or {}
        keys = [r.prompt for r in records]
        shared = Counter(k for k in keys if ar.get(k))
        rows = []
        for rec, k in zip(records, keys):
            if ar.get(k):
                theirs = [self.terms(a) for a in ar[k]]
                rows.append((*self.terms(rec), sum(t[0] for t in theirs) / shared[k],
                             sum(t[1] for t in theirs) / shared[k]))
        return np.array(rows, dtype=float).reshape(-1, 4)

    def estimate(self, rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The metric over `rows` (a 0-d array), or one per resample of `weights`; NaN where a
        denominator sums to 0 (no verify step, no AR pair)."""
        s = column_sums(rows, weights)
        if self.paired:
            return _ratios(s[..., 0] * s[..., 3], s[..., 1] * s[..., 2])
        return _ratios(s[..., 0], s[..., 1])

    def of(self, records: Sequence[Record], ar: ByPrompt | None = None) -> float:
        """The metric over `records` (AR's answers by prompt for a paired one)."""
        return float(self.estimate(self.rows(records, ar)))

    def replicates(self, rows: np.ndarray, cell: Sequence[Any], resamples: int = N_BOOTSTRAP) -> np.ndarray | None:
        """`resamples` bootstrap estimates over `rows`, drawn with a seed from the metric's name and
        `cell` (the cell's identity); None without rows or resamples. `interval` turns them into
        the 95% interval."""
        if not resamples or not len(rows):
            return None
        return self.estimate(rows, bootstrap_weights(len(rows), seed_of(self.name, *cell), resamples))

    def sides(self, rows: np.ndarray) -> tuple[float, float]:
        """A paired metric's two ratios, (Σ num / Σ den, Σ AR num / Σ AR den): speedup's tokens/s
        of the answers and AR's tokens/s on their prompts."""
        s = column_sums(rows)
        return float(_ratios(s[0], s[1])), float(_ratios(s[2], s[3]))


def _accepted(rec: Record) -> list[int]:
    return rec.steps.accepted or []


TAU = RatioOfSums("tau", tokens_and_steps)
SPEEDUP = RatioOfSums("speedup", lambda r: (r.new_tokens, r.wall_s), paired=True)
TOKENS_PER_VERIFY = RatioOfSums("tokens_per_verify", lambda r: (sum(r.steps.tree_size or []), tokens_and_steps(r)[1]))


def depth_acceptance(depth: int) -> RatioOfSums:
    """The share of verify steps whose accepted path reached `depth` (1-based) drafts."""
    return RatioOfSums(f"depth{depth}", lambda r: (sum(a >= depth for a in _accepted(r)), len(_accepted(r))))


def tau(records: Sequence[Record]) -> float:
    """`TAU` over `records`: mean accepted length; NaN with no steps."""
    return TAU.of(records)


def per_depth_acceptance(records: Sequence[Record]) -> list[float]:
    """`depth_acceptance(d)` for d = 1..the deepest acceptance (element 0 is depth 1). Empty when
    no step accepted a draft (AR, or no answers)."""
    deepest = max((max(_accepted(r)) for r in records if _accepted(r)), default=0)
    return [depth_acceptance(d).of(records) for d in range(1, deepest + 1)]


# ----------------------------------------------------------------------------- summary.csv

def _ms_per_step(records: list[Record], column: Callable[[Record], list[float] | None]) -> float:
    total = sum(sum(column(r) or []) for r in records)
    steps = sum(len(r.steps.tokens if r.steps.tokens is not None else column(r) or []) for r in records)
    return total / steps if steps else math.nan


def _throughput(records: list[Record]) -> float:
    """Σ new_tokens / Σ wall_s of answers that have no AR pair (AR's own rows among them)."""
    seconds = sum(r.wall_s for r in records)
    return sum(r.new_tokens for r in records) / seconds if seconds else math.nan


def summarize(records: list[Record]) -> pd.DataFrame:
    """One row per (method, benchmark, temperature, acceptance) with SUMMARY_COLUMNS.

    AR rows are included (tau 1, speedup 1). tokens_per_s, ar_tokens_per_s and speedup are taken
    over the answers that have an AR answer for the same prompt (`SPEEDUP`, as in the tables),
    so speedup is tokens_per_s / ar_tokens_per_s; a row with no AR pair has speedup and
    ar_tokens_per_s NaN and tokens_per_s over all its answers. Rows: ar first, then methods in
    order of first appearance; within a method, benchmarks in order of first appearance, then
    temperature ascending, then acceptance in order of first appearance. `other_cpu_cores`: the
    mean over the answers that measured it (NaN for runs before it existed).
    """
    records = dedupe(records)
    if not records:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)

    ar = ar_by_prompt(records)
    groups: dict[tuple, list[Record]] = {}
    for rec in records:
        groups.setdefault((rec.method, rec.benchmark, rec.temperature, rec.acceptance), []).append(rec)

    rows: list[dict[str, Any]] = []
    for (method, benchmark, temperature, acceptance), recs in groups.items():
        pairs = SPEEDUP.rows(recs, ar)
        if method == AR_METHOD:
            tps = _throughput(recs)
            ar_tps, speedup = tps, 1.0
        elif len(pairs):
            tps, ar_tps = SPEEDUP.sides(pairs)
            speedup = float(SPEEDUP.estimate(pairs))
        else:
            tps, ar_tps, speedup = _throughput(recs), math.nan, math.nan
        diverged = own_divergences(recs)
        cores = [r.other_cpu_cores for r in recs if r.other_cpu_cores is not None]
        rows.append({
            "method": method,
            "benchmark": benchmark,
            "temperature": temperature,
            "acceptance": acceptance,
            "answers": len(recs),
            "new_tokens": int(sum(r.new_tokens for r in recs)),
            "tau": TAU.of(recs),
            "speedup": speedup,
            "tokens_per_s": tps,
            "ar_tokens_per_s": ar_tps,
            "draft_ms_per_step": _ms_per_step(recs, lambda r: r.steps.draft_ms),
            "verify_ms_per_step": _ms_per_step(recs, lambda r: r.steps.verify_ms),
            "mismatches": len(diverged),
            "mismatches_near_tie": sum(bool(d.get("near_tie")) for d in diverged),
            "other_cpu_cores": float(np.mean(cores)) if cores else math.nan,
        })

    def first_seen(values: Iterable[str]) -> dict[str, int]:
        order: dict[str, int] = {}
        for v in values:
            order.setdefault(v, len(order))
        return order

    method_rank = {m: (m != AR_METHOD, i) for m, i in first_seen(r.method for r in records).items()}
    bench_rank = first_seen(r.benchmark for r in records)
    accept_rank = first_seen(r.acceptance for r in records)
    rows.sort(key=lambda row: (
        method_rank[row["method"]], bench_rank[row["benchmark"]], row["temperature"],
        accept_rank[row["acceptance"]],
    ))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def write_summary(records: list[Record], path: Path) -> pd.DataFrame:
    """Write `summarize(records)` to CSV at `path` and return the rounded frame as written."""
    df = summarize(records).round(ROUNDING)
    write_atomic(path, df.to_csv(index=False))
    return df


# ----------------------------------------------------------------------------- divergence from AR

def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers near x: 2**(floor(log2|x|) - 7), bf16 having 8 significant bits.

    Exact (via frexp, no float log2 rounding). bf16 has float32's exponent range, so below the
    smallest normal (2**-126) and at 0 the spacing is the subnormal one, 2**-133.
    """
    x = abs(float(x))
    if math.isnan(x) or math.isinf(x):
        return x
    if x < 2.0**-126:
        return 2.0**-133
    _, e = math.frexp(x)  # x = m * 2**e with m in [0.5, 1), so floor(log2 x) = e - 1
    return math.ldexp(1.0, e - 1 - 7)


def is_near_tie(top1: float | None, gap: float | None) -> bool:
    """True when AR's top-2 gap is within 2 bf16 ulps of its top-1 logit: at that gap rounding
    alone can swap the argmax, so a greedy mismatch there is not evidence of a bug."""
    if top1 is None or gap is None:
        return False
    return gap <= 2 * bf16_ulp(top1)


def first_divergence(
    output_ids: Sequence[int],
    ar_output_ids: Sequence[int],
    ar_top1: Sequence[float] | None,
    ar_gap: Sequence[float] | None,
    inherited: bool,
) -> dict | None:
    """First position where a greedy answer differs from AR's answer to the same prompt, or None.

    Returns {"position", "top1", "gap", "near_tie", "inherited"} with top1/gap being AR's top-1
    logit and top1-top2 gap at that position. When the answers agree over their common length but
    one is longer (one stopped earlier), position = common length, near_tie is False (a stop is
    not a token choice), and top1/gap are AR's at that position when AR has one, else null (JSON
    null rather than inf, which strict JSON cannot hold). `inherited` marks a difference whose
    cause is upstream (e.g. an earlier turn already diverged) and is stored as given.
    """
    common = min(len(output_ids), len(ar_output_ids))
    position = next((i for i in range(common) if output_ids[i] != ar_output_ids[i]), None)
    token_choice = position is not None
    if position is None:
        if len(output_ids) == len(ar_output_ids):
            return None
        position = common

    def at(values: Sequence[float] | None) -> float | None:
        return float(values[position]) if values is not None and position < len(values) else None

    top1, gap = at(ar_top1), at(ar_gap)
    return {
        "position": position,
        "top1": top1,
        "gap": gap,
        "near_tie": token_choice and is_near_tie(top1, gap),
        "inherited": bool(inherited),
    }


def own_divergences(records: list[Record]) -> list[dict]:
    """The `divergence` of each record that left AR's output by itself (not `inherited` from an
    earlier turn that already differed); records need `attach_divergences` first."""
    return [r.divergence for r in records if r.divergence and not r.divergence.get("inherited", False)]


def attach_divergences(records: list[Record]) -> list[Record]:
    """Fill `divergence` on every greedy (T = 0) non-AR record from AR's record for the same prompt.

    Done when reading, not when writing: AR runs inside a per-prompt rotation, so it may finish
    after the method, and records are appended as soon as each answer is done. A later turn whose
    earlier turn already differed from AR's is marked `inherited` (its prompt differs from AR's).
    """
    ar = {r.prompt: r for r in records if r.is_ar}

    def turn_key(r: Record, turn: int) -> tuple:
        # Seeds differ per turn, so earlier turns are found by question and settings, not seed.
        return (r.benchmark, r.question_id, turn, r.temperature, r.top_p, r.implementation)

    ar_turn = {turn_key(r, r.turn): r for r in records if r.is_ar}
    own_turn = {(r.method, r.config_hash, turn_key(r, r.turn)): r for r in records}
    for rec in records:
        if rec.is_ar or rec.temperature != 0.0:
            continue
        ref = ar.get(rec.prompt)
        if ref is None:
            continue
        inherited = False
        for turn in range(rec.turn):
            own = own_turn.get((rec.method, rec.config_hash, turn_key(rec, turn)))
            ar_prev = ar_turn.get(turn_key(rec, turn))
            if own is not None and ar_prev is not None and own.output_ids != ar_prev.output_ids:
                inherited = True
        rec.divergence = first_divergence(rec.output_ids, ref.output_ids, ref.ar_top1, ref.ar_gap, inherited)
    return records
