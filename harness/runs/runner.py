"""Runs AR and methods over benchmark prompts, appends one record per answer, resumes, shows progress.

The unit of work is one keyed cell (method config hash, benchmark, question, turn, temperature,
acceptance, seed): finished cells are skipped on a rerun, so a killed run resumes where it
stopped and a later distributed backend can hand cells out without changing the loop.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness.core.decode import Generation, GenerationConfig, generate
from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash
from harness.core.target import Target, check_target_spec
from harness.core.verify import Sampling, default_rule
from harness.runs.benchmarks import Question, load_questions, resolve_data_dir, verify_data_dir
from harness.runs.metrics import AR_METHOD, attach_divergences, write_summary
from harness.runs.results import RunDir, default_run_dir, load_average_warning, record_key

WARMUP_TOKENS = 16


@dataclass
class RunConfig:
    """Everything that determines a run's numbers (its hash names the default output folder)."""

    methods: list[str]
    benchmarks: list[str]
    target: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    limit: int | None = None
    ids: list[int] | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    acceptance: str | None = None
    seed: int = 0
    checkpoint: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)   # --set: {key: v} or {"method.key": v}
    chat_template: str | None = None
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = default_rule(self.temperature)
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise SpecbenchError(f"--limit must be >= 1, got {self.limit}")
        self.sampling()  # validates temperature / top-p / acceptance together

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.acceptance)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """`--set key=value` (repeatable): values parsed as JSON, else kept as strings."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SpecbenchError(f"--set expects key=value, got '{pair}'")
        key, raw = pair.split("=", 1)
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def method_overrides(method_cls: type, settings: dict[str, Any], all_methods: list[str]) -> dict[str, Any]:
    """The --set entries that apply to one method: `method.key=v` for it, plain `key=v` where it has the key."""
    mine: dict[str, Any] = {}
    for key, value in settings.items():
        if "." in key:
            name, sub = key.split(".", 1)
            if name == method_cls.name:
                mine[sub] = value
        elif key in method_cls.defaults:
            mine[key] = value
    return mine


def check_settings(settings: dict[str, Any], classes: dict[str, type]) -> None:
    """Every --set key must be used by at least one method of the run."""
    for key in settings:
        if "." in key:
            name, sub = key.split(".", 1)
            if name not in classes:
                raise SpecbenchError(f"--set {key}: method '{name}' is not in this run ({', '.join(classes)})")
            classes[name].resolve_config({sub: settings[key]})
        elif not any(key in c.defaults for c in classes.values()):
            if len(classes) == 1:
                next(iter(classes.values())).resolve_config({key: settings[key]})  # raises with did-you-mean
            raise SpecbenchError(f"--set {key}: no method of this run ({', '.join(classes)}) has that key")


def answer_seed(seed: int, benchmark: str, question_id: int, turn: int) -> int:
    """Per-answer seed: sampling results never depend on the order questions run in."""
    h = hashlib.sha256(f"{seed}:{benchmark}:{question_id}:{turn}".encode()).digest()
    return int.from_bytes(h[:4], "little")


@dataclass
class MethodSlot:
    name: str
    drafter: Any            # None for AR
    config: dict[str, Any]
    config_hash: str
    checkpoint_hash: str | None
    label: str = ""         # shown in progress; a variant's settings when one method runs in several configs


PROGRESS_COLUMNS = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())


class Runner:
    """Runs `cfg` on one target. `variants` (used by `cli.py ablate`): several override sets of
    the run's method(s), each its own slot beside AR in the per-prompt rotation (labels are the
    dict keys). A caller running several Runners on one loaded target and one progress view
    (harness.runs.compare) passes `target`, calls `prepare()` for each, then `run_cells(...)`."""

    def __init__(self, cfg: RunConfig, out: Path | None = None, data_dir: str | Path | None = None,
                 console: Console | None = None, target: Target | None = None,
                 variants: dict[str, dict[str, Any]] | None = None) -> None:
        from methods.registry import get_method

        self.variants = variants
        self.cfg = cfg
        self.console = console or Console(stderr=True)
        self.data_dir = resolve_data_dir(data_dir)
        names = [m for m in cfg.methods if m != AR_METHOD]
        if len(set(names)) != len(names):
            raise SpecbenchError(f"--method lists a method twice: {','.join(cfg.methods)}")
        if target is None:
            check_target_spec(cfg.target)
        self.classes = {m: get_method(m) for m in names}   # unknown names fail here, before loading
        check_settings(cfg.settings, self.classes)
        if cfg.checkpoint and not any(c.trainable for c in self.classes.values()):
            raise SpecbenchError("--checkpoint given, but no method of this run loads weights")
        self.questions = {b: load_questions(b, self.data_dir, cfg.limit, cfg.ids) for b in cfg.benchmarks}
        self.run_dir = RunDir(out or default_run_dir(cfg.to_dict()))
        self.target = target
        self.slots: list[MethodSlot] = []

    # ------------------------------------------------------------------ setup
    def _load(self) -> None:
        if self.target is None:
            warn = load_average_warning()
            if warn:
                self.console.print(f"[yellow]warning:[/] {warn}")
            with self.console.status(f"loading target {self.cfg.target}"):
                self.target = Target.load(self.cfg.target, self.cfg.device, self.cfg.dtype,
                                          self.cfg.chat_template, self.cfg.system_prompt)
        ar_conf: dict[str, Any] = {}
        self.slots = [MethodSlot(AR_METHOD, None, ar_conf, config_hash({"method": AR_METHOD}), None)]
        for name, cls in self.classes.items():
            overrides = method_overrides(cls, self.cfg.settings, list(self.classes))
            for label, extra in (self.variants or {name: {}}).items():
                drafter = cls.create(self.target, {**overrides, **extra},
                                     checkpoint=self.cfg.checkpoint if cls.trainable else None)
                ck = drafter.checkpoint_hash()
                h = config_hash({"method": name, "config": drafter.config, "checkpoint": ck})
                twin = next((s.label for s in self.slots if s.config_hash == h), None)
                if twin is not None:
                    raise SpecbenchError(f"variants '{twin}' and '{label}' of {name} are the same config")
                self.slots.append(MethodSlot(name, drafter, drafter.config, h, ck, label))

    def _meta_config(self) -> dict[str, Any]:
        return {**self.cfg.to_dict(), "methods_resolved": {
            (s.label or s.name): {"config": s.config, "config_hash": s.config_hash,
                                  "checkpoint_hash": s.checkpoint_hash,
                                  "parameters": s.drafter.num_parameters() if s.drafter is not None else 0}
            for s in self.slots}}

    # ------------------------------------------------------------------ one answer
    def _messages(self, history: list[dict], q: Question, turn: int) -> list[dict]:
        return history + [{"role": "user", "content": q.turns[turn]}]

    def _answer(self, slot: MethodSlot, prompt_ids: list[int], seed: int) -> Generation:
        cfg = GenerationConfig(self.cfg.max_new_tokens, self.cfg.sampling(), seed=seed,
                               record_logit_gaps=(slot.drafter is None and self.cfg.temperature == 0))
        return generate(self.target, prompt_ids, cfg, slot.drafter)

    def _record(self, slot: MethodSlot, q: Question, turn: int, seed: int, prompt_ids: list[int],
                g: Generation) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "method": slot.name, "method_config": slot.config, "config_hash": slot.config_hash,
            "checkpoint_hash": slot.checkpoint_hash, "target": self.cfg.target,
            "dtype": str(self.target.dtype).replace("torch.", ""), "device": str(self.target.device),
            "benchmark": q.benchmark, "question_id": q.question_id, "category": q.category, "turn": turn,
            "temperature": float(self.cfg.temperature), "top_p": float(self.cfg.top_p),
            "acceptance": "none" if slot.drafter is None else self.cfg.acceptance, "seed": seed,
            "prompt_tokens": len(prompt_ids), "new_tokens": len(g.output_ids), "output_ids": g.output_ids,
            "stop_reason": g.stop_reason, "wall_s": round(g.wall_s, 6), "prefill_s": round(g.prefill_s, 6),
            "first_token_from_prefill": True, "steps": g.steps,
        }
        if g.top1 is not None:
            rec["ar_top1"] = [round(x, 5) for x in g.top1]
            rec["ar_gap"] = [round(x, 5) for x in g.gap]
        rec["key"] = record_key(rec)
        return rec

    # ------------------------------------------------------------------ the grid
    def run(self) -> Path:
        self._load()
        self.run_dir.open(self._meta_config())
        meta_extra = {"data_dir": str(self.data_dir), "official_prompts": verify_data_dir(self.data_dir)}
        self.run_dir.write_extra(meta_extra)
        self._warm_up()
        with Progress(*PROGRESS_COLUMNS, console=self.console, transient=False) as progress:
            task = progress.add_task("answers", total=self.total_answers())
            self.run_cells(progress, task)
        return self.run_dir.path

    def prepare(self) -> dict[str, Any]:
        """Load the target (unless given) and the drafters; return the config `run` stores in
        meta.json. With `warm_up` and `run_cells`, what `run` does, for callers that share one
        target and one progress view over several Runners."""
        self._load()
        return self._meta_config()

    def warm_up(self) -> None:
        self._warm_up()

    def total_answers(self) -> int:
        return sum(len(q.turns) for qs in self.questions.values() for q in qs) * len(self.slots)

    def run_cells(self, progress: Progress, task: TaskID, prefix: str = "") -> None:
        """Answer every cell not recorded yet, advancing `task` of `progress` once per answer."""
        done = self.run_dir.done_keys()
        existing = {r["key"]: r for r in self.run_dir.records()}
        rotation = 0
        for bench, questions in self.questions.items():
            for q in questions:
                # Keyed by config hash: variants of one method keep their own conversations.
                histories: dict[str, list[dict]] = {s.config_hash: [] for s in self.slots}
                for turn in range(len(q.turns)):
                    seed = answer_seed(self.cfg.seed, bench, q.question_id, turn)
                    # Rotate the order per prompt so that machine drift favours no method.
                    order = self.slots[rotation % len(self.slots):] + self.slots[:rotation % len(self.slots)]
                    rotation += 1
                    for slot in order:
                        messages = self._messages(histories[slot.config_hash], q, turn)
                        probe = {"method": slot.name, "config_hash": slot.config_hash, "benchmark": bench,
                                 "question_id": q.question_id, "turn": turn,
                                 "temperature": float(self.cfg.temperature),
                                 "acceptance": "none" if slot.drafter is None else self.cfg.acceptance,
                                 "seed": seed}
                        key = record_key(probe)
                        progress.update(task, description=f"{prefix}{bench} q{q.question_id} t{turn} "
                                                          f"{slot.label or slot.name}")
                        if key in done:
                            out_ids = existing[key]["output_ids"]
                        else:
                            prompt_ids = self.target.encode_chat(messages)
                            g = self._answer(slot, prompt_ids, seed)
                            rec = self._record(slot, q, turn, seed, prompt_ids, g)
                            self.run_dir.append(rec)
                            out_ids = g.output_ids
                        # Each method continues MT-Bench turn 2 from its own turn-1 answer.
                        histories[slot.config_hash] = messages + [
                            {"role": "assistant", "content": self.target.decode(out_ids).strip()}]
                        progress.advance(task)
            self.write_summary()

    def _warm_up(self) -> None:
        """One untimed short generation per method, so no method pays for first-call costs."""
        first = next((qs[0] for qs in self.questions.values() if qs), None)
        if first is None:
            return
        ids = self.target.encode_chat([{"role": "user", "content": first.turns[0]}])
        with self.console.status("warming up"):
            for slot in self.slots:
                cfg = GenerationConfig(min(WARMUP_TOKENS, self.cfg.max_new_tokens), self.cfg.sampling(), seed=0)
                generate(self.target, ids, cfg, slot.drafter)

    def write_summary(self):
        records = attach_divergences(self.run_dir.records())
        return write_summary(records, self.run_dir.summary_path)


def summarize_dir(path: Path):
    """Rebuild summary.csv of a run directory from its records alone."""
    rd = RunDir(path)
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    return write_summary(attach_divergences(rd.records()), rd.summary_path)
