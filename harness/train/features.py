"""Target features for training: one forward per distilled conversation, cached as bf16 shards.

For every committed response (datasets/distill/<target>/shard-*.jsonl) the prompt is re-read from
the prompt file by id and re-templated, the target runs once over prompt + response, and we store
token ids, the loss mask (assistant tokens only) and the last-layer *normed* hidden states for
every position (the prompt too: a draft attends over it at inference), plus optional extra
layers and each conversation's `prompt_key` (the held-out split is by prompt). Shards go under
$SPECBENCH_CACHE/features-v2/<target>/<plan hash>-<dtype>/ and are skipped when present, so
extraction resumes after an interruption, shard by shard, on any machine.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from harness.core.errors import SpecbenchError
from harness.core.target import cache_root
from harness.train.data import ids_key, prompt_key
from harness.train.distill import Conversations, read_prompts, record_ids

# Cached shards of an older layout (no `prompt_key`) live elsewhere and are never read.
FEATURES_DIR = "features-v2"


def feature_dir(target, distill_dir: Path, manifest: dict | None = None, layers: list[int] | None = None) -> Path:
    """The shards' folder; shards that also hold extra `layers` have their own (`...-L2-15-27`)."""
    manifest = manifest or json.loads((distill_dir / "manifest.json").read_text())
    dt = str(target.dtype).replace("torch.", "")
    extra = "".join(f"-L{i}" if not n else f"-{i}" for n, i in enumerate(layers or []))
    return cache_root() / FEATURES_DIR / target.name / f"{manifest['plan_hash']}-{dt}{extra}"


def covering_dir(target, distill_dir: Path, manifest: dict, layers: list[int] | None,
                 stems: list[str]) -> Path | None:
    """A cached feature folder of the same plan and dtype that holds every shard in `stems` with
    at least `layers` (a folder extracted for EAGLE-3's three layers also holds the last-layer
    features every other drafter reads), so no shard is extracted twice; None if there is none."""
    exact = feature_dir(target, distill_dir, manifest, layers)
    want = set(layers or [])
    for folder in [exact, *sorted(exact.parent.glob(f"{manifest['plan_hash']}-*"))]:
        name = folder.name.removeprefix(exact.name.split("-L")[0])
        if name and not name.startswith("-L"):
            continue  # another dtype
        have = {int(x.removeprefix("L")) for x in name.removeprefix("-").split("-") if x}
        if want <= have and all((folder / f"{st}.safetensors").exists() for st in stems):
            return folder
    return None


def _conversations(target, shard: Path, convs: Conversations) -> tuple[list[tuple[list[int], int]], list[int]]:
    """(token ids, length of everything before the final answer) of each record of a shard, and
    each record's `prompt_key` (its first user turn's text)."""
    out, keys = [], []
    for line in shard.read_text().splitlines():
        rec = json.loads(line)
        try:
            messages = convs.messages(rec)
            prompt = target.encode_chat(messages)
        except SpecbenchError as e:
            raise SpecbenchError(f"{shard}: {e}") from None
        out.append((prompt + record_ids(rec), len(prompt)))
        keys.append(prompt_key(messages[0]["content"]))
    return out, keys


@torch.inference_mode()
def extract_features(target, distill_dir: Path, prompts_file: Path, batch_size: int = 16,
                     layers: list[int] | None = None, progress=None, shards: int | None = None) -> Path:
    """Extract every missing feature shard (of the first `shards` only, if given); returns the
    feature folder."""
    if not (distill_dir / "manifest.json").exists():
        raise SpecbenchError(f"{distill_dir} has no manifest.json: run `cli.py distill` first")
    manifest = json.loads((distill_dir / "manifest.json").read_text())
    if manifest.get("vocab_hash") != target.vocab_hash():
        raise SpecbenchError(f"{distill_dir} was distilled with another tokenizer than target '{target.name}'")
    files = sorted(distill_dir.glob("shard-*.jsonl"))[:shards]
    superset = covering_dir(target, distill_dir, manifest, layers, [s.stem for s in files])
    if superset is not None:
        return superset
    out = feature_dir(target, distill_dir, manifest, layers)
    out.mkdir(parents=True, exist_ok=True)
    convs = Conversations(target, read_prompts(prompts_file), manifest.get("plan", {}), distill_dir)
    todo = [s for s in files if not (out / (s.stem + ".safetensors")).exists()]
    task = progress.add_task("features", total=len(todo)) if progress else None
    for shard in todo:
        conversations, keys = _conversations(target, shard, convs)
        tensors = shard_tensors(target, conversations, batch_size, layers, keys)
        tmp = out / f".{shard.stem}.tmp"
        save_file(tensors, str(tmp), metadata={"source": shard.name})
        os.replace(tmp, out / (shard.stem + ".safetensors"))
        if progress:
            progress.advance(task)
    return out


@torch.inference_mode()
def shard_tensors(target, convs: list[tuple[list[int], int]], batch_size: int = 16,
                  layers: list[int] | None = None, keys: list[int] | None = None) -> dict[str, torch.Tensor]:
    """Features of (token ids, prompt length) conversations as one shard's tensors; `keys`: each
    conversation's `prompt_key` (default: a hash of its prompt ids)."""
    order = sorted(range(len(convs)), key=lambda i: len(convs[i][0]))
    hidden: list[torch.Tensor | None] = [None] * len(convs)
    extra: dict[int, list] = {i: [None] * len(convs) for i in (layers or [])}
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        width = max(len(convs[i][0]) for i in idx)
        ids = torch.zeros((len(idx), width), dtype=torch.long)
        att = torch.zeros_like(ids)
        for r, i in enumerate(idx):  # right padding: positions stay 0..n-1
            n = len(convs[i][0])
            ids[r, :n] = torch.tensor(convs[i][0])
            att[r, :n] = 1
        res = target.backbone(input_ids=ids.to(target.device), attention_mask=att.to(target.device),
                              use_cache=False, output_hidden_states=bool(layers))
        for r, i in enumerate(idx):
            n = len(convs[i][0])
            hidden[i] = res.last_hidden_state[r, :n].to(torch.bfloat16).cpu()
            for layer in layers or []:
                extra[layer][i] = res.hidden_states[layer][r, :n].to(torch.bfloat16).cpu()
    lengths = torch.tensor([len(c[0]) for c in convs])
    tensors = {
        "input_ids": torch.tensor([t for c in convs for t in c[0]], dtype=torch.int32),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "prompt_len": torch.tensor([c[1] for c in convs], dtype=torch.long),
        "prompt_key": torch.tensor(keys if keys is not None else [ids_key(torch.tensor(c[0][: c[1]]))
                                                                  for c in convs], dtype=torch.long),
        "hidden": torch.cat(hidden),
    }
    for layer, vals in extra.items():
        tensors[f"layer_{layer}"] = torch.cat(vals)
    return tensors


def load_feature_shards(folder: Path, shards: int | None = None,
                        layers: list[int] | None = None) -> list[dict[str, torch.Tensor]]:
    """The first `shards` feature shards (all when None), in distill-shard order, with the extra
    `layers` asked for and no others (a folder may hold more: see `covering_dir`)."""
    return list(iter_feature_shards(folder, shards, layers))


def iter_feature_shards(folder: Path, shards: int | None = None,
                        layers: list[int] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """`load_feature_shards` one shard at a time (so a reader holds one in memory)."""
    files = sorted(folder.glob("shard-*.safetensors"))[:shards]
    if not files:
        raise SpecbenchError(f"no feature shards in {folder}: run `cli.py train` (it extracts them) or check --data")
    keys = ["input_ids", "offsets", "prompt_len", "prompt_key", "hidden", *(f"layer_{i}" for i in layers or [])]
    for f in files:
        with safe_open(str(f), framework="pt") as shard:
            yield {k: shard.get_tensor(k) for k in keys}
