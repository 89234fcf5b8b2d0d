"""Self-distillation data: the target answers training prompts, and the token ids are committed.

`cli.py distill` builds a deterministic plan (which prompts, how many responses each, with which
sampling settings), then generates it shard by shard with batched, length-bucketed HF `generate`.
Each finished shard is written atomically to `datasets/distill/<target>/shard-NNNNN.jsonl`, so an
interrupted run resumes at the first missing shard and the work can be spread over several runs.
Responses are stored as base64 little-endian uint16 token ids (~2.7 MB per million tokens), or
uint32 for a vocabulary past 65,536 ids (Qwen2.5's 151,936; such records say `"id_bytes": 4`);
prompts are never stored: they are re-read from the prompt file by id.

Prompt mix: the shared prompt file is 82% GSM8K math; the plan keeps every non-math prompt and
subsamples math to at most `max_math_share` of the prompts. To widen the mix, each prompt gets a
greedy response plus `samples - 1` sampled ones (T = 0.8, top-p 0.95): different continuations
of the same prompt, which is what the draft meets when it is wrong. More data for the same prompts
is a plan with another `seed` (another math subsample and other samples) and `greedy=False`
(sampled responses only, as the greedy ones are already in the first folder).

Second turns (`followups`): a plan can instead continue the greedy answers of a base folder (a
sibling under datasets/distill/) with a follow-up request from a fixed list of generic
instructions (`datasets/followups.jsonl`, written for this project, copied into the manifest),
and store the target's answer to it. Benchmarks such as MT-Bench ask a second turn whose prompt
holds the first answer; a small target often repeats itself there, and drafts trained only on
single turns never saw that. Only the second answer is a training target.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from harness.core.errors import SpecbenchError
from harness.core.timing import Clock

MATH_CATEGORIES = {"math"}


@dataclass(frozen=True)
class DistillPlan:
    prompts_file: str
    n: int | None = None             # cap on prompts (after the mix); None = all
    samples: int = 2                 # responses per prompt: 1 greedy + (samples-1) sampled
    greedy: bool = True              # False: sampled responses only (more data beside a folder that has the greedy ones)
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 384
    max_prompt_tokens: int = 768
    max_math_share: float = 1 / 3
    shard_size: int = 96
    seed: int = 0
    base: str | None = None            # follow-up plans: the sibling folder whose greedy answers they continue
    followups: tuple[str, ...] = ()    # follow-up instructions (the text itself, so the plan hash covers it)

    def __post_init__(self) -> None:
        if not self.sample_indices:
            raise SpecbenchError(f"a plan without the greedy answer needs samples >= 2 (got {self.samples}): "
                                 "use --samples 2 or more")

    def settings(self) -> dict:
        d = asdict(self)
        d["prompts_file"] = Path(self.prompts_file).name
        if self.greedy:  # plans with a greedy answer keep the settings (and hash) they always had
            del d["greedy"]
        if self.base is None:  # single-turn plans likewise
            del d["base"], d["followups"]
        else:
            d["followups"] = list(self.followups)
        return d

    @property
    def sample_indices(self) -> range:
        """The responses asked per conversation: 0 is the greedy one, the rest are sampled."""
        return range(0 if self.greedy else 1, self.samples)


def read_followups(path: Path) -> tuple[str, ...]:
    """Follow-up instructions, one {"text": ...} per line."""
    if not path.is_file():
        raise SpecbenchError(f"follow-up file {path} not found (the project's list is datasets/followups.jsonl)")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(str(json.loads(line)["text"]))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SpecbenchError(f"{path}:{i}: malformed follow-up record ({e}); expected {{\"text\": ...}}") from None
    if not out:
        raise SpecbenchError(f"{path} holds no follow-ups")
    return tuple(out)


class Conversations:
    """The chat messages of a distill job or record: the prompt, and for a follow-up plan the base
    folder's greedy answer to it and the follow-up request. One builder for generation and for
    feature extraction, so both see the same tokens."""

    def __init__(self, target, prompts: dict[str, dict], plan_settings: dict, folder: Path) -> None:
        self.prompts = prompts
        self.followups = list(plan_settings.get("followups") or [])
        self.first: dict[str, str] = {}
        base = plan_settings.get("base")
        if base:
            base_dir = folder.parent / base
            if not (base_dir / "manifest.json").exists():
                raise SpecbenchError(f"{folder} continues the answers of {base_dir}, which has no manifest.json")
            for rec in load_distilled(base_dir):
                if rec["sample"] == 0:
                    self.first[rec["prompt_id"]] = target.decode(rec["response_ids"])

    def messages(self, rec: dict) -> list[dict[str, str]]:
        pid = rec["prompt_id"]
        if pid not in self.prompts:
            raise SpecbenchError(f"prompt id {pid} is not in the prompt file; wrong --prompts?")
        msgs = [{"role": "user", "content": self.prompts[pid]["prompt"]}]
        if "followup" in rec:
            if pid not in self.first:
                raise SpecbenchError(f"prompt id {pid} has no greedy answer in the base folder; was it re-distilled?")
            msgs += [{"role": "assistant", "content": self.first[pid]},
                     {"role": "user", "content": self.followups[rec["followup"]]}]
        return msgs


def id_bytes(vocab_size: int) -> int:
    """Bytes per stored token id: 2 while every id fits uint16 (the committed SmolLM2 data), else 4."""
    return 2 if vocab_size <= 1 << 16 else 4


def encode_ids(ids: list[int], width: int = 2) -> str:
    if width == 2 and ids and max(ids) >= 1 << 16:
        raise SpecbenchError(f"token id {max(ids)} does not fit uint16; store this vocabulary with 4-byte ids")
    return base64.b64encode(np.asarray(ids, dtype=f"<u{width}").tobytes()).decode()


def decode_ids(s: str, width: int = 2) -> list[int]:
    return np.frombuffer(base64.b64decode(s), dtype=f"<u{width}").astype(np.int64).tolist()


def record_ids(rec: dict) -> list[int]:
    """The response token ids of a distilled record (2-byte ids unless it says otherwise)."""
    return decode_ids(rec["response"], int(rec.get("id_bytes", 2)))


def read_prompts(path: Path) -> dict[str, dict]:
    if not path.is_file():
        raise SpecbenchError(f"prompt file {path} not found; pass --prompts (e.g. ../shared/data/train_prompts/prompts.jsonl)")
    out = {}
    with path.open() as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                out[str(rec["id"])] = rec
            except (json.JSONDecodeError, KeyError) as e:
                raise SpecbenchError(f"{path}:{i}: malformed prompt record ({e})") from None
    return out


def select_prompts(prompts: dict[str, dict], plan: DistillPlan) -> list[str]:
    """Every non-math prompt, math subsampled to at most max_math_share; deterministic."""
    rng = random.Random(plan.seed)
    other = [k for k, r in prompts.items() if r.get("category") not in MATH_CATEGORIES]
    math = [k for k, r in prompts.items() if r.get("category") in MATH_CATEGORIES]
    rng.shuffle(math)
    keep_math = int(len(other) * plan.max_math_share / (1 - plan.max_math_share))
    chosen = other + math[:keep_math]
    rng.shuffle(chosen)
    return chosen[: plan.n] if plan.n else chosen


def build_jobs(target, prompts: dict[str, dict], plan: DistillPlan, convs: Conversations) -> list[dict]:
    """(prompt id, sample index[, follow-up index]) jobs, length-bucketed: sorted by (sampled?,
    prompt length). A follow-up plan takes the base folder's greedy answers (capped at `n`, in a
    seeded order), each with one follow-up drawn by the seed."""
    if plan.base is None:
        chosen = [{"prompt_id": pid} for pid in select_prompts(prompts, plan)]
    else:
        rng = random.Random(plan.seed)
        pids = sorted(pid for pid in convs.first if pid in prompts)
        rng.shuffle(pids)
        chosen = [{"prompt_id": pid, "followup": rng.randrange(len(plan.followups))} for pid in pids]
    jobs = []
    for job in chosen:
        ids = target.encode_chat(convs.messages(job))
        if len(ids) > plan.max_prompt_tokens:
            continue
        for s in plan.sample_indices:
            jobs.append({**job, "sample": s, "prompt_len": len(ids)})
        if plan.base is not None and plan.n and len(jobs) >= plan.n * len(plan.sample_indices):
            break
    jobs.sort(key=lambda j: (j["sample"] > 0, j["prompt_len"], j["prompt_id"], j["sample"]))
    return jobs


def _generate_batch(target, batch: list[list[int]], plan: DistillPlan, sampled: bool, seed: int) -> list[tuple[list[int], str]]:
    pad = next(iter(sorted(target.eos_token_ids)), 0)
    width = max(len(b) for b in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, b in enumerate(batch):  # left padding: every prompt ends at the same column
        ids[i, width - len(b):] = torch.tensor(b)
        mask[i, width - len(b):] = 1
    torch.manual_seed(seed)
    kw = dict(do_sample=True, temperature=plan.temperature, top_p=plan.top_p) if sampled else dict(do_sample=False)
    with torch.inference_mode():
        out = target.model.generate(ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=plan.max_new_tokens, pad_token_id=pad,
                                    eos_token_id=sorted(target.eos_token_ids), **kw)
    res = []
    for row in out[:, width:].tolist():
        stop = "length"
        for j, t in enumerate(row):
            if t in target.eos_token_ids:
                row, stop = row[: j + 1], "eos"
                break
        res.append((row, stop))
    return res


def distill(target, prompts_file: Path, out_dir: Path, plan: DistillPlan, batch_size: int = 32,
            max_shards: int | None = None, progress=None) -> dict:
    """Generate the plan's missing shards into out_dir; returns counts. Resumable."""
    prompts = read_prompts(prompts_file)
    convs = Conversations(target, prompts, plan.settings(), out_dir)
    jobs = build_jobs(target, prompts, plan, convs)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = [(j["prompt_id"], j["sample"]) + ((j["followup"],) if "followup" in j else ()) for j in jobs]
    plan_hash = hashlib.sha256(json.dumps([plan.settings(), keys]).encode()).hexdigest()[:12]
    manifest_path = out_dir / "manifest.json"
    manifest = {"target": target.name, "vocab_hash": target.vocab_hash(), "plan": plan.settings(),
                "plan_hash": plan_hash, "jobs": len(jobs), "shard_size": plan.shard_size,
                "dtype": str(target.dtype).replace("torch.", ""), "batch_size": batch_size,
                "format": "jsonl; response = base64 little-endian uint16 token ids (uint32 where a record "
                          "has id_bytes 4; EOS included when reached)"}
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old.get("plan_hash") != plan_hash:
            raise SpecbenchError(f"{out_dir} holds another distillation plan ({old.get('plan_hash')} vs {plan_hash}); "
                                 "use another --out or the same settings")
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    shards = [jobs[i : i + plan.shard_size] for i in range(0, len(jobs), plan.shard_size)]
    todo = [i for i in range(len(shards)) if not (out_dir / f"shard-{i:05d}.jsonl").exists()]
    if max_shards is not None:
        todo = todo[:max_shards]
    task = progress.add_task("distill", total=len(todo)) if progress else None
    made = 0
    width = id_bytes(target.vocab_size)
    wide = {"id_bytes": width} if width != 2 else {}
    clock = Clock(target.devices)
    for si in todo:
        t0 = clock.now()
        lines = []
        shard_tokens = 0
        shard = shards[si]
        for b in range(0, len(shard), batch_size):
            chunk = shard[b : b + batch_size]
            sampled = chunk[0]["sample"] > 0
            seed = plan.seed * 1_000_003 + si * 1000 + b
            batch_ids = [target.encode_chat(convs.messages(j)) for j in chunk]
            for j, (resp, stop) in zip(chunk, _generate_batch(target, batch_ids, plan, sampled, seed)):
                lines.append({"prompt_id": j["prompt_id"], "sample": j["sample"],
                              **({"followup": j["followup"]} if "followup" in j else {}),
                              "temperature": plan.temperature if sampled else 0.0,
                              "top_p": plan.top_p if sampled else 1.0, "seed": seed if sampled else None,
                              "max_new_tokens": plan.max_new_tokens, "stop": stop, "n": len(resp),
                              **wide, "response": encode_ids(resp, width)})
                shard_tokens += len(resp)
        tmp = out_dir / f".shard-{si:05d}.tmp"
        tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
        os.replace(tmp, out_dir / f"shard-{si:05d}.jsonl")
        made += shard_tokens
        if progress:
            rate = shard_tokens / max(1e-9, clock.now() - t0)
            progress.update(task, advance=1, description=f"shard {si}: {rate:.0f} tok/s, {made} tokens this run")
    return {"jobs": len(jobs), "shards": len(shards), "generated_now": len(todo), "tokens_now": made}


def load_distilled(out_dir: Path) -> list[dict]:
    """All committed responses of a distill folder (token ids decoded)."""
    recs = []
    for p in sorted(out_dir.glob("shard-*.jsonl")):
        for line in p.read_text().splitlines():
            r = json.loads(line)
            r["response_ids"] = record_ids(r)
            del r["response"]
            recs.append(r)
    return recs
