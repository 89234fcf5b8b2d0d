"""Ours beside the official implementations (a run folder made by `cli.py peers`): per peer, τ of
both, how many answers are step-identical, where the others first part, and the speed of both.

An answer pair is our answer and the peer's to the same prompt (benchmark, question, turn,
temperature, seed). It is *step-identical* when the output tokens and the new tokens of every
verify step agree; *identical but the last step* when they agree up to the step at the token
limit, where our loop shrinks the tree to the room left (by design) and the peer's does not. For
every other pair the table names the first verify step that differs, with both sides' counts.
Speed: tokens/s of each side (Σ tokens / Σ seconds), each side's speedup over its own plain
decoding in the same folder, and ours ÷ theirs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.runs.metrics import SPEEDUP, TAU, ar_by_prompt
from harness.runs.record import Record
from harness.runs.run_data import RunData


@dataclass
class PairVerdict:
    kind: str                 # "step-identical" | "last step" | "output" | "steps"
    first_step: int | None    # 1-based verify step where the two first differ (None: none does)
    ours: int | None          # our new tokens at that step
    theirs: int | None        # the peer's


def compare_pair(ours: Record, theirs: Record) -> PairVerdict:
    """How one of our answers agrees with the peer's answer to the same prompt."""
    a, b = list(ours.steps.tokens or []), list(theirs.steps.tokens or [])
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    same_out = ours.output_ids == theirs.output_ids
    if first is None:
        return PairVerdict("step-identical" if same_out else "output", None, None, None)
    at = (first + 1, a[first] if first < len(a) else None, b[first] if first < len(b) else None)
    if same_out and first == len(a) - 1 and len(a) == len(b):
        return PairVerdict("last step", *at)
    return PairVerdict("steps" if same_out else "output", *at)


def _key(r: Record) -> tuple:
    return (r.benchmark, r.question_id, r.turn, r.temperature, r.seed)


def peer_pairs(run: RunData, label: str, entry: dict) -> list[tuple[Record, Record]]:
    """(ours, theirs) for every prompt both answered, for the peer rows of `label`."""
    theirs = [r for r in run.records if r.config_hash == entry["config_hash"]]
    ours = {_key(r): r for r in run.records if r.method == entry["method"] and r.implementation is None}
    return [(ours[_key(t)], t) for t in theirs if _key(t) in ours]


def agreement_frame(run: RunData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one line per peer, one line per answer pair) of a peers run folder."""
    ar = ar_by_prompt(run.records)
    lines, answers = [], []
    for label, entry in (run.meta.get("peers") or {}).items():
        if entry.get("method") in (None, "ar"):
            continue
        pairs = peer_pairs(run, label, entry)
        if not pairs:
            continue
        verdicts = [compare_pair(o, t) for o, t in pairs]
        ours, theirs = [o for o, _ in pairs], [t for _, t in pairs]
        ours_tps, ar_tps = SPEEDUP.sides(SPEEDUP.rows(ours, ar))
        theirs_tps, peer_ar_tps = SPEEDUP.sides(SPEEDUP.rows(theirs, ar))
        count = {k: sum(v.kind == k for v in verdicts) for k in ("step-identical", "last step", "steps", "output")}
        lines.append({"peer": label, "method": entry["method"], "answers": len(pairs),
                      "tau_ours": round(TAU.of(ours), 4), "tau_official": round(TAU.of(theirs), 4),
                      "step_identical": count["step-identical"], "identical_but_last_step": count["last step"],
                      "steps_differ": count["steps"], "outputs_differ": count["output"],
                      "tok_s_ours": round(ours_tps, 3), "tok_s_official": round(theirs_tps, 3),
                      "speedup_ours": round(ours_tps / ar_tps, 4) if ar_tps else math.nan,
                      "speedup_official": round(theirs_tps / peer_ar_tps, 4) if peer_ar_tps else math.nan,
                      "ours_over_official": round(ours_tps / theirs_tps, 4) if theirs_tps else math.nan})
        for (o, t), v in zip(pairs, verdicts):
            answers.append({"peer": label, "benchmark": o.benchmark, "question_id": o.question_id, "turn": o.turn,
                            "verdict": v.kind, "first_step": v.first_step, "ours_tokens": v.ours,
                            "official_tokens": v.theirs, "steps_ours": len(o.steps.tokens or []),
                            "steps_official": len(t.steps.tokens or [])})
    return pd.DataFrame(lines), pd.DataFrame(answers)


def peers_text(frame: pd.DataFrame, setting: str) -> str:
    """The markdown table: a line per peer."""
    header = ["Peer", "τ ours", "τ official", "Step-identical", "Tok/s ours ÷ official", "Speedup ours",
              "Speedup official"]
    out = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * (len(header) - 1)]
    for rec in frame.to_dict("records"):
        same = rec["step_identical"] + rec["identical_but_last_step"]
        out.append(f"| {rec['peer']} | {rec['tau_ours']:.2f} | {rec['tau_official']:.2f} | {same}/{rec['answers']} | "
                   f"{rec['ours_over_official']:.2f} | {rec['speedup_ours']:.2f}× | {rec['speedup_official']:.2f}× |")
    caption = ("Each official implementation (the peer) and ours on the same target, drafter weights and prompt "
               "ids. Step-identical: the same output tokens and the same new tokens at every verify step, the "
               "step at the token limit excepted (ours shrinks the tree to the room left); tables/peers-answers.csv "
               "names the first differing step of every other answer. Speedups: over each side's own plain "
               f"decoding in this folder. {setting}")
    return "\n".join(out + ["", caption]) + "\n"


def write_peer_tables(run: RunData, setting: str) -> list[Path]:
    """tables/peers.md, peers.csv and peers-answers.csv of a peers run folder ([] for other folders)."""
    if not run.meta.get("peers"):
        return []
    frame, answers = agreement_frame(run)
    if frame.empty:
        return []
    out = run.path / "tables"
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.md").write_text(peers_text(frame, setting), encoding="utf-8")
    frame.to_csv(out / "peers.csv", index=False, lineterminator="\n")
    answers.to_csv(out / "peers-answers.csv", index=False, lineterminator="\n")
    return [out / "peers.md", out / "peers.csv", out / "peers-answers.csv"]
