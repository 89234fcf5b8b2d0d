"""Metrics computed from answer records: tau, speedup, per-depth acceptance, divergence from AR.

Everything here reads the records of `records.jsonl` (schema in harness/results.py and
DESIGN.md "Records") and nothing else, so tables can be rebuilt from a run directory alone.

- tau = Σ steps.tokens / Σ verify steps (prefill excluded, bonus token included, tokens after
  EOS or the limit trimmed). AR yields one token per step, so its tau is exactly 1.
- speedup = (Σ new_tokens / Σ wall_s of the method) / (Σ new_tokens / Σ wall_s of AR) over the
  same prompts (benchmark, question_id, turn, temperature, top_p, seed) of the same records,
  paired regardless of acceptance: a ratio of throughputs, not a mean of per-question ratios.

Both are computed in one place, `AnswerSums`: summary.csv (`summarize`) here, and the tables,
plots and bootstrap intervals of harness/runs/statistics.py, take their numbers from it.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

AR_METHOD = "ar"
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
# The fields that make "the same prompt" for pairing a method's answer with AR's.
PROMPT_FIELDS = ("benchmark", "question_id", "turn", "temperature", "top_p", "seed")


# ----------------------------------------------------------------------------- per-record helpers

def _steps(rec: dict) -> dict:
    return rec.get("steps") or {}


def tokens_and_steps(rec: dict) -> tuple[int, int]:
    """(Σ tokens over verify steps, number of verify steps) of one answer.

    An AR record that logs no steps counts one step per token not produced by the prefill, which
    is what AR does; a drafter record without steps counts nothing.
    """
    tokens = _steps(rec).get("tokens")
    if tokens is not None:
        return int(sum(tokens)), len(tokens)
    if rec.get("method") == AR_METHOD:
        n = int(rec.get("new_tokens", 0)) - int(bool(rec.get("first_token_from_prefill", False)))
        return max(n, 0), max(n, 0)
    return 0, 0


def prompt_key(rec: dict) -> tuple:
    """Identity of the prompt an answer is for; numbers normalised so 0 and 0.0 pair."""
    return (
        rec["benchmark"], int(rec["question_id"]), int(rec["turn"]), float(rec["temperature"]),
        float(rec.get("top_p", 1.0)), int(rec["seed"]),
    )


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, NaN where den is 0 (a resample may draw no verify step)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def _throughput(records: Iterable[dict]) -> float:
    """Σ new_tokens / Σ wall_s: long answers weigh more, as they do in the user's wait."""
    records = list(records)
    return _ratio(sum(r["new_tokens"] for r in records), sum(r["wall_s"] for r in records))


def dedupe(records: Iterable[dict]) -> list[dict]:
    """One record per key, the last one winning: records merged from resumed or parallel runs
    may repeat an answer, and counting it twice would skew every sum."""
    from harness.runs.results import record_key  # local: keeps metrics importable on its own

    by_key: dict[str, dict] = {}
    for rec in records:
        key = rec.get("key") or record_key(rec)
        by_key[key] = rec  # keeps the first occurrence's place, so row order is unchanged
    return list(by_key.values())


def ar_by_prompt(records: Iterable[dict]) -> dict[tuple, list[dict]]:
    """AR's answers by `prompt_key`: what a method's answer is paired with for its speedup."""
    out: dict[tuple, list[dict]] = {}
    for rec in records:
        if rec["method"] == AR_METHOD:
            out.setdefault(prompt_key(rec), []).append(rec)
    return out


# ----------------------------------------------------------------------------- τ and speedup

@dataclass(frozen=True)
class AnswerSums:
    """The per-answer numbers that τ and speedup are ratios of sums of: the one computation behind
    summary.csv, the tables, the plots and the regression baselines.

    `counts` is [answers, 2]: tokens and verify steps (`tokens_and_steps`). `pairs` is [answers that
    have an AR answer to the same prompt, 4]: tokens, wall_s, AR tokens, AR wall_s. An AR answer
    shared by k answers of the set (variants of one method pooled in one summary.csv row) is
    split k ways, so it counts once, as AR answered it once.

    `weights` ([resamples, rows]: how often each row is drawn, a bootstrap) gives one estimate per
    resample; without it, the estimate over the answers as they are.
    """

    counts: np.ndarray
    pairs: np.ndarray

    @classmethod
    def of(cls, records: Sequence[dict], ar: dict[tuple, list[dict]] | None = None) -> AnswerSums:
        ar = ar or {}
        counts = np.array([tokens_and_steps(r) for r in records], dtype=float).reshape(-1, 2)
        keys = [prompt_key(r) for r in records]
        shared = Counter(k for k in keys if ar.get(k))
        pairs = [(r["new_tokens"], r["wall_s"], sum(a["new_tokens"] for a in ar[k]) / shared[k],
                  sum(a["wall_s"] for a in ar[k]) / shared[k]) for r, k in zip(records, keys) if ar.get(k)]
        return cls(counts, np.array(pairs, dtype=float).reshape(-1, 4))

    @staticmethod
    def _sums(rows: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        # Column by column (numpy's pairwise sum): the order the committed tables were summed in, so
        # a rebuild matches them to the last digit; a bootstrap sums each resample by matmul.
        if weights is None:
            return np.array([rows[:, j].sum() for j in range(rows.shape[1])])
        return weights @ rows

    def tau(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Σ tokens / Σ verify steps (a 0-d array without weights); NaN with no steps."""
        s = self._sums(self.counts, weights)
        return _ratios(s[..., 0], s[..., 1])

    def speedup(self, weights: np.ndarray | None = None) -> np.ndarray:
        """(Σ tokens / Σ s) / (Σ AR tokens / Σ AR s) over the paired answers; NaN with no pair."""
        s = self._sums(self.pairs, weights)
        return _ratios(s[..., 0] * s[..., 3], s[..., 1] * s[..., 2])

    def throughputs(self) -> tuple[float, float]:
        """(tokens/s of the paired answers, AR's tokens/s on their prompts); their ratio is `speedup`."""
        s = self._sums(self.pairs, None)
        return float(_ratios(s[0], s[1])), float(_ratios(s[2], s[3]))


def tau(records: Sequence[dict]) -> float:
    """Mean accepted length: Σ steps.tokens / Σ verify steps over the answers; NaN with no steps."""
    return float(AnswerSums.of(records).tau())


def per_depth_acceptance(records: Iterable[dict]) -> list[float]:
    """For depth d = 1..max accepted, the share of verify steps that accepted at least d drafts.

    Element 0 is depth 1. Empty when there are no steps (AR, or no answers).
    """
    accepted = [a for rec in records for a in _steps(rec).get("accepted", [])]
    if not accepted:
        return []
    n = len(accepted)
    return [sum(a >= d for a in accepted) / n for d in range(1, max(accepted) + 1)]


def _ms_per_step(records: list[dict], column: str) -> float:
    total = sum(sum(_steps(r).get(column, [])) for r in records)
    steps = sum(len(_steps(r).get("tokens", _steps(r).get(column, []))) for r in records)
    return _ratio(total, steps)


# ----------------------------------------------------------------------------- summary.csv

def _mean_of(recs: list[dict], field: str) -> float:
    """Mean of a field over the records that have it (NaN where none does: runs before it existed)."""
    values = [r[field] for r in recs if r.get(field) is not None]
    return float(np.mean(values)) if values else math.nan


def summarize(records: list[dict]) -> pd.DataFrame:
    """One row per (method, benchmark, temperature, acceptance) with SUMMARY_COLUMNS.

    AR rows are included (tau 1, speedup 1). tokens_per_s, ar_tokens_per_s and speedup are taken
    over the answers that have an AR answer for the same prompt (`AnswerSums`, as in the tables),
    so speedup is tokens_per_s / ar_tokens_per_s; a row with no AR pair has speedup and
    ar_tokens_per_s NaN and tokens_per_s over all its answers. Rows: ar first, then methods in
    order of first appearance; within a method, benchmarks in order of first appearance, then
    temperature ascending, then acceptance in order of first appearance.
    """
    records = dedupe(records)
    if not records:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)

    ar = ar_by_prompt(records)
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        group = (rec["method"], rec["benchmark"], float(rec["temperature"]), rec["acceptance"])
        groups.setdefault(group, []).append(rec)

    rows: list[dict[str, Any]] = []
    for (method, benchmark, temperature, acceptance), recs in groups.items():
        sums = AnswerSums.of(recs, ar)
        if method == AR_METHOD:
            tps = _throughput(recs)
            ar_tps, speedup = tps, 1.0
        elif len(sums.pairs):
            tps, ar_tps = sums.throughputs()
            speedup = float(sums.speedup())
        else:
            tps, ar_tps, speedup = _throughput(recs), math.nan, math.nan
        diverged = own_divergences(recs)
        rows.append({
            "method": method,
            "benchmark": benchmark,
            "temperature": temperature,
            "acceptance": acceptance,
            "answers": len(recs),
            "new_tokens": int(sum(r["new_tokens"] for r in recs)),
            "tau": float(sums.tau()),
            "speedup": speedup,
            "tokens_per_s": tps,
            "ar_tokens_per_s": ar_tps,
            "draft_ms_per_step": _ms_per_step(recs, "draft_ms"),
            "verify_ms_per_step": _ms_per_step(recs, "verify_ms"),
            "mismatches": len(diverged),
            "mismatches_near_tie": sum(bool(d.get("near_tie")) for d in diverged),
            "other_cpu_cores": _mean_of(recs, "other_cpu_cores"),
        })

    def first_seen(values: Iterable[str]) -> dict[str, int]:
        order: dict[str, int] = {}
        for v in values:
            order.setdefault(v, len(order))
        return order

    method_rank = first_seen(r["method"] for r in records)
    method_rank = {m: (m != AR_METHOD, i) for m, i in method_rank.items()}
    bench_rank = first_seen(r["benchmark"] for r in records)
    accept_rank = first_seen(r["acceptance"] for r in records)
    rows.sort(key=lambda row: (
        method_rank[row["method"]], bench_rank[row["benchmark"]], row["temperature"],
        accept_rank[row["acceptance"]],
    ))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def write_summary(records: list[dict], path: Path) -> pd.DataFrame:
    """Write `summarize(records)` to CSV at `path` and return the rounded frame as written."""
    df = summarize(records).round(ROUNDING)
    df.to_csv(path, index=False)
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


def own_divergences(records: list[dict]) -> list[dict]:
    """The `divergence` of each record that left AR's output by itself (not `inherited` from an
    earlier turn that already differed); records need `attach_divergences` first."""
    return [r["divergence"] for r in records
            if r.get("divergence") and not r["divergence"].get("inherited", False)]


def attach_divergences(records: list[dict]) -> list[dict]:
    """Fill `divergence` on every greedy (T = 0) non-AR record from AR's record for the same prompt.

    Done when reading, not when writing: AR runs inside a per-prompt rotation, so it may finish
    after the method, and records are appended as soon as each answer is done. A later turn whose
    earlier turn already differed from AR's is marked `inherited` (its prompt differs from AR's).
    """
    ar = {prompt_key(r): r for r in records if r["method"] == AR_METHOD}

    def turn_key(r: dict, turn: int) -> tuple:
        # Seeds differ per turn, so earlier turns are found by question and settings, not seed.
        return (r["benchmark"], r["question_id"], turn, float(r["temperature"]), float(r.get("top_p", 1.0)))

    ar_turn = {turn_key(r, r["turn"]): r for r in records if r["method"] == AR_METHOD}
    own_turn = {(r["method"], r.get("config_hash"), turn_key(r, r["turn"])): r for r in records}
    for rec in records:
        if rec["method"] == AR_METHOD or float(rec["temperature"]) != 0.0:
            continue
        ref = ar.get(prompt_key(rec))
        if ref is None:
            continue
        inherited = False
        for turn in range(int(rec.get("turn", 0))):
            own = own_turn.get((rec["method"], rec.get("config_hash"), turn_key(rec, turn)))
            ar_prev = ar_turn.get(turn_key(rec, turn))
            if own is not None and ar_prev is not None and own["output_ids"] != ar_prev["output_ids"]:
                inherited = True
        rec["divergence"] = first_divergence(rec["output_ids"], ref["output_ids"], ref.get("ar_top1"),
                                             ref.get("ar_gap"), inherited)
    return records
