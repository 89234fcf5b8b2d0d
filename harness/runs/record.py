"""One answer as `records.jsonl` holds it: the `Record` the runner writes and every statistic reads.

A line of records.jsonl is one answer of one method (or AR) to one turn of one prompt: who answered
(method, its config and hashes, target, dtype, device), to what (benchmark, question, turn, the
sampling settings, the per-answer seed), what came out (tokens, stop reason, seconds) and, per
verify step (`Steps`), the tree size, the drafts accepted, the new tokens and the milliseconds.
Greedy AR answers also carry AR's top-1 logit and top-2 gap per position (`ar_top1`, `ar_gap`): a
method's first divergence from AR is judged against them when the records are read.

Schema versions (`schema`, the first key of a line since version 2):
  1  every line written before the version was stored. Fields added over time are filled with
     the defaults the code that read them used: `lossy` from the rule's name (typical was the
     one lossy rule then), `top_p` 1.0, `category` "", `device` "cpu", `prefill_s` 0.0,
     `first_token_from_prefill` False, no steps (AR then counts one step per token), and a
     missing `key` computed from the fields (`record_key`).
  2  the same fields, plus `schema`. Lines written before `question_sha256` (the question's
     line) and `steps.tree_depth` were kept lack them: their provenance is unknown, and their
     accepted drafts are checked against the tree's size instead of its depth.
A record's fields must agree with each other (`record_problem`): every reader of records.jsonl
refuses a line that does not, so a hand-edited or corrupted line never turns into a wrong τ.
Keys this code does not know (a newer writer's) are kept in `extra` and written back after the
known ones, so reading and rewriting a record loses nothing.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash

SCHEMA_VERSION = 2
AR_METHOD = "ar"
# Fields every record needs: the parts of its key.
REQUIRED = ("method", "benchmark", "question_id", "turn", "temperature", "acceptance", "seed")
# Fields written only when set (prompt files, the question's line, greedy AR, a measured CPU load, the
# read-time divergence, a peer's implementation).
OPTIONAL = ("prompt_sha256", "question_sha256", "ar_top1", "ar_gap", "other_cpu_cores", "divergence",
            "implementation")


def is_lossy(fields_: Mapping[str, Any]) -> bool:
    """Whether a record's (or a history line's) acceptance rule is lossy, as the runner wrote it
    (`"lossy"`); lines written before it did fall back to typical, the one lossy rule of that time."""
    if "lossy" in fields_:
        return bool(fields_["lossy"])
    return fields_.get("acceptance") == "typical"


@dataclass(kw_only=True)
class Steps:
    """One entry per verify step of an answer in each list; None where the record holds no such list
    (AR answers of early runs logged no steps)."""

    tree_size: list[int] | None = None    # draft tokens verified (tree nodes under the root)
    tree_depth: list[int] | None = None   # the tree's depth: the most drafts the step could accept
    accepted: list[int] | None = None     # drafts accepted
    tokens: list[int] | None = None       # new tokens: accepted drafts + the target's bonus token, trimmed
    draft_ms: list[float] | None = None
    verify_ms: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # lists this code does not know

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Steps:
        data = dict(data or {})
        known = {f.name: data.pop(f.name) for f in fields(cls) if f.name != "extra" and f.name in data}
        return cls(**known, extra=data)

    def to_json_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}


@dataclass(kw_only=True)
class Record:
    """One answer (one line of records.jsonl). Fields in the order a line holds them."""

    schema: int = SCHEMA_VERSION
    method: str                          # "ar" for plain decoding
    method_config: dict[str, Any] = field(default_factory=dict)
    config_hash: str | None = None       # of method, config and checkpoint: tells variants of a method apart
    checkpoint_hash: str | None = None
    target: str | None = None
    dtype: str | None = None
    device: str = "cpu"
    benchmark: str
    question_id: int
    category: str = ""
    turn: int
    temperature: float
    top_p: float = 1.0
    acceptance: str                      # the verification rule; "none" for AR
    seed: int                            # the answer's own seed (executor.answer_seed)
    lossy: bool = False
    prompt_sha256: str | None = None     # a user's prompt file: its SHA-256 (part of the key)
    question_sha256: str | None = None   # the question's line in its file: what was answered (None: not recorded)
    prompt_tokens: int | None = None
    new_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    stop_reason: str | None = None
    wall_s: float = 0.0                  # prefill included
    prefill_s: float = 0.0
    first_token_from_prefill: bool = False
    steps: Steps = field(default_factory=Steps)
    ar_top1: list[float] | None = None   # greedy AR: top-1 logit per position
    ar_gap: list[float] | None = None    # greedy AR: top-1 minus top-2 logit per position
    key: str = ""                        # record_key; "" until computed
    other_cpu_cores: float | None = None  # cores other processes used meanwhile
    divergence: dict[str, Any] | None = None  # first divergence from AR (metrics.attach_divergences), read time only
    implementation: str | None = None    # an official implementation that answered (a peer, harness/peers); None: ours
    extra: dict[str, Any] = field(default_factory=dict)   # keys this code does not know, kept

    def __post_init__(self) -> None:
        if not self.key:
            self.key = record_key(self)

    @property
    def is_ar(self) -> bool:
        return self.method == AR_METHOD

    @property
    def prompt(self) -> tuple[str, int, int, float, float, int] | tuple[str, int, int, float, float, int, str]:
        """Identity of the prompt answered: (benchmark, question_id, turn, temperature, top_p, seed),
        and the implementation for a peer's answer. A method's answer is paired with AR's answer to
        the same prompt, whatever the rules; a peer's with its own AR's."""
        base = (self.benchmark, self.question_id, self.turn, self.temperature, self.top_p, self.seed)
        return base if self.implementation is None else (*base, self.implementation)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """A record from one parsed line, of any schema version (the module docstring says what
        an old line's missing fields become); unknown keys go to `extra`."""
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise SpecbenchError(f"a record lacks {', '.join(missing)}: not a records.jsonl line ({_brief(data)})")
        rest = dict(data)
        known = {f.name: rest.pop(f.name) for f in fields(cls) if f.name != "extra" and f.name in rest}
        try:
            known.update(schema=int(data.get("schema", 1)), lossy=is_lossy(data), question_id=int(data["question_id"]),
                         turn=int(data["turn"]), temperature=float(data["temperature"]),
                         top_p=float(data.get("top_p", 1.0)), seed=int(data["seed"]), key=data.get("key") or "",
                         steps=Steps.from_dict(data.get("steps")))
            return cls(**known, extra=rest)
        except (TypeError, ValueError, AttributeError) as e:  # e.g. "question_id": "abc", "steps": [1]
            raise SpecbenchError(f"a record has a malformed field ({e}): {_brief(data)}") from None

    def to_json_dict(self) -> dict[str, Any]:
        """The line as the runner writes it: every field in order, the optional ones only when set,
        then the unknown keys a read kept."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in OPTIONAL and value is None):
                continue
            out[f.name] = value.to_json_dict() if isinstance(value, Steps) else value
        return {**out, **self.extra}


STEP_LISTS = ("tree_size", "tree_depth", "accepted", "tokens", "draft_ms", "verify_ms")


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def record_problem(rec: Record) -> str | None:
    """The first way `rec`'s fields disagree with each other, or None when they agree: the
    output is `new_tokens` long; the step lists are equally long, counts and finite numbers;
    the steps' tokens add up to `new_tokens` (less the prefill's first token); no step accepts
    more drafts than its tree is deep (its size, in lines without the depth); and every step
    keeps its accepted drafts plus the target's bonus token, the last one possibly cut by EOS or
    the token limit, so τ from the tokens is τ from the accepted drafts."""
    if not (_is_number(rec.temperature) and rec.temperature >= 0):
        return f"temperature {rec.temperature!r} is not a finite number >= 0"
    if not _is_count(rec.new_tokens):
        return f"new_tokens {rec.new_tokens!r} is not a count"
    if not isinstance(rec.output_ids, list) or len(rec.output_ids) != rec.new_tokens:
        have = len(rec.output_ids) if isinstance(rec.output_ids, list) else "no list of"
        return f"new_tokens {rec.new_tokens} but {have} output_ids"
    for name in ("wall_s", "prefill_s"):
        if not (_is_number(getattr(rec, name)) and getattr(rec, name) >= 0):
            return f"{name} {getattr(rec, name)!r} is not a finite number >= 0"
    lists = {n: getattr(rec.steps, n) for n in STEP_LISTS if getattr(rec.steps, n) is not None}
    for name, values in lists.items():
        ok = _is_number if name.endswith("_ms") else _is_count
        if not isinstance(values, list) or not all(ok(v) for v in values):
            return f"steps.{name} is not a list of {'finite numbers' if name.endswith('_ms') else 'counts'}"
    if len({len(v) for v in lists.values()}) > 1:
        return "steps lists differ in length (" + ", ".join(f"{n} {len(v)}" for n, v in lists.items()) + ")"
    tokens, accepted = lists.get("tokens"), lists.get("accepted")
    if tokens is None:
        return None
    first = int(bool(rec.first_token_from_prefill))
    if sum(tokens) + first != rec.new_tokens:
        return (f"steps.tokens add up to {sum(tokens)}" + (" (+1 from the prefill)" if first else "")
                + f" but new_tokens is {rec.new_tokens}")
    bound_name = "tree_depth" if "tree_depth" in lists else "tree_size"
    bound = lists.get(bound_name)
    for i, a in enumerate(accepted or []):
        if bound is not None and a > bound[i]:
            return f"step {i + 1} accepted {a} drafts from a tree of {bound_name.replace('_', ' ')} {bound[i]}"
        last = i == len(tokens) - 1
        if tokens[i] > a + 1 or (tokens[i] < a + 1 and not last) or tokens[i] < 1:
            return (f"step {i + 1} kept {tokens[i]} tokens for {a} accepted drafts (a step keeps its accepted "
                    "drafts and one bonus token)")
    return None


def record_key(rec: Record | Mapping[str, Any]) -> str:
    """An answer's identity: `|`.join of method, config_hash, benchmark, question_id, turn,
    temperature, acceptance, seed (from the fields, whatever key a line stores).

    Numbers are normalised (temperature as a float repr, ids as ints) so that 0 and 0.0 give one
    key. A record without `config_hash` takes the hash of its `method_config`. A record of a
    user's prompt file keys its benchmark as `name@<first 12 hex of the file's SHA-256>`, so
    answers to an edited file never pass for answers to the old one.
    """
    if not isinstance(rec, Record):
        rec = Record.from_dict({**rec, "key": "-"})   # "-": skip computing the key twice
    chash = rec.config_hash or config_hash(rec.method_config)
    bench = rec.benchmark + (f"@{rec.prompt_sha256[:12]}" if rec.prompt_sha256 else "")
    parts = (rec.method, chash, bench, int(rec.question_id), int(rec.turn), repr(float(rec.temperature)),
             rec.acceptance, int(rec.seed))
    return "|".join(str(p) for p in parts)


def _brief(data: Mapping[str, Any]) -> str:
    text = ", ".join(f"{k}={data[k]!r}" for k in list(data)[:4])
    return text if len(text) < 80 else text[:77] + "..."
