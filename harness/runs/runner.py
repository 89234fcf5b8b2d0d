"""One temperature's answers: AR and the methods' slots on every question and turn of the run.

The unit of work is one keyed answer (method config hash, benchmark, question, turn, temperature,
acceptance, seed): `Runner.answer` gives it, or None when the run folder holds it already, so a
killed run resumes where it stopped. The executor's backends walk a schedule of answers through
it: the local one `rotation` (methods take turns per prompt), the Ray one a `cell` (one slot on
one benchmark). The Runner never writes: its caller is the run folder's one writer.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from harness.core.decode import Generation, GenerationConfig, generate
from harness.core.machine_meta import OtherCpuUse
from harness.core.target import Target
from harness.core.verify import LOSSY_RULES
from harness.runs.benchmarks import Question
from harness.runs.config import RunConfig
from harness.runs.record import Record, Steps, record_key
from harness.runs.slots import MethodSlot

WARMUP_TOKENS = 16
Answer = tuple[MethodSlot, Question, int]   # a slot's answer to one turn of one question


def answer_seed(seed: int, benchmark: str, question_id: int, turn: int) -> int:
    """Per-answer seed: sampling results never depend on the order questions run in."""
    h = hashlib.sha256(f"{seed}:{benchmark}:{question_id}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little")


class Runner:
    """The answers of one RunConfig of one temperature and rule (`RunConfig.runs`): its questions
    x `slots` (AR and the methods, or an ablation's variants). `target` is None where only keys
    are asked (the Ray driver)."""

    def __init__(self, cfg: RunConfig, questions: dict[str, list[Question]], target: Target | None,
                 slots: list[MethodSlot]) -> None:
        self.cfg = cfg
        self.questions = questions
        self.target = target
        self.slots = slots
        self._rotation = 0                             # prompts scheduled so far (`rotation`)
        self._histories: dict[str, list[dict]] = {}    # each slot's conversation so far, by config hash

    def total_answers(self) -> int:
        return sum(len(q.turns) for qs in self.questions.values() for q in qs) * len(self.slots)

    # ------------------------------------------------------------------ the schedules
    def rotation(self, bench: str) -> Iterator[Answer]:
        """Every answer on `bench`, question by question and turn by turn, the slots in an order
        rotated per prompt so that machine drift favours no method."""
        for q in self.questions[bench]:
            for turn in range(len(q.turns)):
                k = self._rotation % len(self.slots)
                self._rotation += 1
                for slot in self.slots[k:] + self.slots[:k]:
                    yield slot, q, turn

    def cell(self, slot: MethodSlot, bench: str) -> Iterator[Answer]:
        """One cell: `slot`'s answers on `bench`, in question and turn order."""
        for q in self.questions[bench]:
            for turn in range(len(q.turns)):
                yield slot, q, turn

    def cell_keys(self, slot: MethodSlot, bench: str) -> list[str]:
        """Record keys of one cell (a slot on one benchmark: every question and turn)."""
        return [record_key(self._probe(slot, bench, q.question_id, turn)) for _, q, turn in self.cell(slot, bench)]

    # ------------------------------------------------------------------ one answer
    def answer(self, slot: MethodSlot, q: Question, turn: int, existing: dict[str, Record]) -> Record | None:
        """`slot`'s answer to turn `turn` of `q`, after its own earlier turns of `q` (so a schedule
        gives a slot's turns of one question in order, with no other question of it between);
        None when `existing` (the run folder's records by key) holds it already."""
        history = [] if turn == 0 else self._histories[slot.config_hash]
        messages = history + [{"role": "user", "content": q.turns[turn]}]
        probe = self._probe(slot, q.benchmark, q.question_id, turn)
        key = record_key(probe)
        rec = None
        if key in existing:
            out_ids = existing[key].output_ids
        else:
            prompt_ids = self.target.encode_chat(messages)
            with OtherCpuUse() as others:
                g = self._answer(slot, prompt_ids, probe["seed"])
            rec = self._record(slot, q, turn, probe["seed"], prompt_ids, g)
            if others.cores is not None:  # what other processes ran meanwhile: a contended answer's seconds are noisy
                rec.other_cpu_cores = round(others.cores, 3)
            out_ids = g.output_ids
        # Each method continues MT-Bench turn 2 from its own turn-1 answer (variants of one
        # method from their own: histories are keyed by config hash).
        self._histories[slot.config_hash] = messages + [
            {"role": "assistant", "content": self.target.decode(out_ids).strip()}]
        return rec

    def _answer(self, slot: MethodSlot, prompt_ids: list[int], seed: int) -> Generation:
        cfg = GenerationConfig(self.cfg.max_new_tokens, self.cfg.sampling(), seed=seed,
                               record_logit_gaps=(slot.drafter is None and self.cfg.temperature == 0))
        return generate(self.target, prompt_ids, cfg, slot.drafter)

    def _record(self, slot: MethodSlot, q: Question, turn: int, seed: int, prompt_ids: list[int],
                g: Generation) -> Record:
        return Record(
            method=slot.name, method_config=slot.config, config_hash=slot.config_hash,
            checkpoint_hash=slot.checkpoint_hash, target=self.cfg.target,
            dtype=str(self.target.dtype).replace("torch.", ""), device=str(self.target.device),
            benchmark=q.benchmark, question_id=q.question_id, category=q.category, turn=turn,
            temperature=float(self.cfg.temperature), top_p=float(self.cfg.top_p),
            acceptance="none" if slot.drafter is None else self.cfg.acceptance, seed=seed,
            lossy=slot.drafter is not None and self.cfg.acceptance in LOSSY_RULES,
            prompt_sha256=self._prompt_file_fields(q.benchmark).get("prompt_sha256"),
            prompt_tokens=len(prompt_ids), new_tokens=len(g.output_ids), output_ids=g.output_ids,
            stop_reason=g.stop_reason, wall_s=round(g.wall_s, 6), prefill_s=round(g.prefill_s, 6),
            first_token_from_prefill=True, steps=Steps.from_dict(g.steps),
            ar_top1=None if g.top1 is None else [round(x, 5) for x in g.top1],
            ar_gap=None if g.top1 is None else [round(x, 5) for x in g.gap])

    def _prompt_file_fields(self, benchmark: str) -> dict[str, str]:
        """A prompt file's SHA-256, which its records carry and their keys include."""
        f = self.cfg.prompt_files.get(benchmark)
        return {"prompt_sha256": f["sha256"]} if f else {}

    def _probe(self, slot: MethodSlot, bench: str, question_id: int, turn: int) -> dict[str, Any]:
        """The fields of an answer's record that make its key."""
        return {"method": slot.name, "config_hash": slot.config_hash, "benchmark": bench,
                "question_id": question_id, "turn": turn, "temperature": float(self.cfg.temperature),
                "acceptance": "none" if slot.drafter is None else self.cfg.acceptance,
                "seed": answer_seed(self.cfg.seed, bench, question_id, turn), **self._prompt_file_fields(bench)}

    def warm_up(self) -> None:
        """One untimed short generation per method at this temperature, so no method pays for
        first-call costs."""
        first = next((qs[0] for qs in self.questions.values() if qs), None)
        if first is None:
            return
        ids = self.target.encode_chat([{"role": "user", "content": first.turns[0]}])
        for slot in self.slots:
            cfg = GenerationConfig(min(WARMUP_TOKENS, self.cfg.max_new_tokens), self.cfg.sampling(), seed=0)
            generate(self.target, ids, cfg, slot.drafter)
        runtimes = [self.target.runtime] + [r for s in self.slots if s.drafter is not None for r in s.drafter.runtimes()]
        for runtime in runtimes:
            if runtime is not None:
                runtime.warm_up_seen()
