"""Train one method on the shared distilled data: extract (or reuse) features, then train.

Used by `cli.py train` and by `cli.py ablate`, which trains an architecture variant it has no
weights for with the same budget before running it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from harness.core.errors import SpecbenchError

DEFAULT_PROMPTS = Path("../shared/data/train_prompts/prompts.jsonl")


def train_method(target, method: str, overrides: dict[str, Any], *, steps: int = 1500, lr: float | None = None,
                 data: list[Path] | None = None, prompts: Path = DEFAULT_PROMPTS, tokens_per_batch: int = 4096,
                 max_len: int = 1024, autocast: str = "auto", out: Path | None = None,
                 init_from: Path | None = None, console: Console | None = None,
                 shards: int | None = None, train_share: float = 1.0,
                 commit_every_s: float = 0.0) -> dict[str, Any]:
    """Train `method` with `overrides` for `steps` optimiser steps; returns the training summary
    (resumes from `out` when a run was interrupted). `init_from` warm-starts from a finished
    checkpoint of the same architecture: a new warm-up + cosine cycle with a fresh optimiser, and
    the summary counts the earlier steps so the total budget stays traceable. `train_share` < 1
    trains on that share of the training conversations (held-out unchanged): the data curve.
    `commit_every_s` > 0 commits `out` to git that often (a training that spans sessions)."""
    from harness.core.paths import REPO_ROOT, repo_relative
    from harness.train.calibrate import calibrate_tree, is_static_tree_drafter
    from harness.train.data import check_train_share
    from harness.train.trainer import TrainConfig, Trainer
    from methods.registry import get_method

    console = console or Console(stderr=True)
    cls = get_method(method)
    if not cls.trainable:
        raise SpecbenchError(f"method '{method}' is training-free: there is nothing to train")
    if cls.weights_from:
        raise SpecbenchError(f"method '{method}' uses the weights of '{cls.weights_from}': train that one")
    config = cls.resolve_config(overrides)
    drafter = cls(target, overrides)
    check_train_share(train_share)
    dataset = load_dataset(target, data, prompts, console, shards, drafter.target_layers() or None, train_share)
    if drafter.draft_vocab_size:
        from harness.train.data import frequent_answer_tokens

        drafter.set_draft_vocab(frequent_answer_tokens(dataset.train, drafter.draft_vocab_size, target.vocab_size))
    out = out or REPO_ROOT / "checkpoints" / target.name / cls.checkpoint_name(config)
    prior = warm_start(drafter, Path(init_from), config) if init_from else None
    cfg = TrainConfig(steps=steps, lr=lr if lr is not None else cls.default_lr, tokens_per_batch=tokens_per_batch,
                      max_len=max_len, autocast=autocast)
    console.print(f"training {method} ({drafter.num_parameters():,} parameters) on {dataset.train_tokens:,} "
                  f"answer tokens for {steps} steps; checkpoints in {out}")
    sources = [{"folder": repo_relative(f), "shards": shards or "all", **({"train_share": train_share} if train_share < 1 else {})}
               for f in distill_folders(target, data)]
    result = Trainer(drafter, dataset, cfg, out, console, prior=prior, sources=sources,
                     commit_every_s=commit_every_s).train()
    if is_static_tree_drafter(drafter):
        # The held-out τ the configured tree gets with these heads, and the best tree of that
        # size (reported; `cli.py calibrate-tree --save` makes it the checkpoint's default).
        fit = calibrate_tree(drafter, dataset.valid, len(drafter.tree.choices))
        result["tree_calibration"] = {k: v for k, v in fit.items() if k != "candidates"}
    return {**result, "out": str(out)}


def evaluate_checkpoint(target, method: str, folder: Path, data: list[Path] | None = None,
                        prompts: Path = DEFAULT_PROMPTS, console: Console | None = None) -> dict[str, float]:
    """Held-out metrics (`val_acc`, ...) of the trained specbench checkpoint in `folder` on the
    held-out split of `data` (default datasets/distill/<target>), with the batches and autocast
    its training evaluated with, so weights trained on other data are read on the same split.
    The weights are the stored (bf16) ones: under bf16 autocast that is what training's
    evaluation multiplied with too; without it a loss moves by ~1e-4."""
    import dataclasses

    from harness.train.trainer import TrainConfig, held_out_metrics
    from methods.registry import get_method

    cls = get_method(method)
    meta = trained_meta(cls, folder, target)
    drafter = cls(target, meta.get("arch", {}))
    load_master_weights(drafter, folder)
    training = meta.get("training") or {}
    keys = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in (training.get("config") or {}).items() if k in keys})
    held_out = load_dataset(target, data, prompts, console, None, drafter.target_layers() or None, train_share=0.0)
    return held_out_metrics(drafter, held_out.valid, cfg, bool(training.get("bf16_autocast", False)))


def trained_meta(cls, folder: Path, target, option: str = "") -> dict[str, Any]:
    """config.json of the trained specbench checkpoint of `cls` in `folder`, checked against
    `target`; a folder without one is refused (`option`: the flag that named the folder)."""
    from methods.common.checkpoint_io import read_config

    if not (folder / "config.json").exists():
        raise SpecbenchError(f"{option}{folder}: no config.json there; point it at a trained specbench checkpoint")
    meta = read_config(folder)
    cls.check_meta(meta, folder, target)
    return meta


def load_master_weights(drafter, folder: Path) -> None:
    """The checkpoint's stored weights into `drafter`'s float32 parameters, as training holds them
    (LearnedDrafter.from_pretrained casts to the target's dtype for decoding instead)."""
    from methods.common.checkpoint_io import read_weights

    file = folder / "model.safetensors"
    drafter.load_state_strictly(read_weights(file), file)


def distill_folders(target, data: list[Path] | None) -> list[Path]:
    """The distill folders to train on: those given, else datasets/distill/<target>."""
    from harness.core.paths import REPO_ROOT

    return [Path(f) for f in data] if data else [REPO_ROOT / "datasets" / "distill" / target.name]


def extract_for(target, drafter, data: list[Path] | None = None, prompts: Path = DEFAULT_PROMPTS,
                console: Console | None = None, shards: int | None = None) -> list[Path]:
    """Extract every missing feature shard `drafter` trains on (the inputs of its target layers
    too), per distill folder; returns the feature folders."""
    from harness.train.features import extract_features

    with Progress(console=console or Console(stderr=True)) as progress:
        return [extract_features(target, folder, prompts, progress=progress, shards=shards,
                                 layers=drafter.target_layers() or None)
                for folder in distill_folders(target, data)]


def load_dataset(target, data: list[Path] | None = None, prompts: Path = DEFAULT_PROMPTS,
                 console: Console | None = None, shards: int | None = None, layers: list[int] | None = None,
                 train_share: float = 1.0):
    """The shared distilled dataset of one or more distill folders (default datasets/distill/<target>;
    the first `shards` shards of each, if given) with its train/held-out split; features are
    extracted first (with the inputs of target `layers` too, for drafters that read them: EAGLE-3).
    The split is by prompt (its first user turn), so a follow-up conversation and every answer to
    one prompt land on the same side. `train_share`: keep that share of the training conversations."""
    from harness.train.data import FeatureDataset
    from harness.train.features import extract_features, iter_feature_shards

    with Progress(console=console or Console(stderr=True)) as progress:
        def every_shard():  # one shard in memory at a time beside what the dataset keeps
            for folder in distill_folders(target, data):
                feats = extract_features(target, folder, prompts, progress=progress, shards=shards, layers=layers)
                yield from iter_feature_shards(feats, shards, layers)

        return FeatureDataset(every_shard(), layers=layers, train_share=train_share)


def warm_start(drafter, folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Load a finished specbench checkpoint of the same method and architecture into `drafter`
    (float32 master weights); returns what the trainer records about it: its steps, seconds and
    the data passes it began, which epoch-scheduled loss terms (Gumiho's MLP CE) continue from."""
    import json

    from harness.core.paths import repo_relative

    meta = trained_meta(type(drafter), folder, drafter.target, "--init-from ")
    arch = {k: config[k] for k in drafter.arch_keys}
    if meta.get("arch") != arch:
        raise SpecbenchError(f"--init-from {folder} holds architecture {meta.get('arch')}, not {arch}: "
                             f"warm-start only from the same architecture")
    load_master_weights(drafter, folder)
    training = meta.get("training") or {}
    epochs = training.get("total_epochs", training.get("epochs"))
    if epochs is None:  # checkpoints written before the summary counted epochs: read the log
        log = folder / "train_log.jsonl"
        rows = log.read_text().splitlines() if log.exists() else []
        epochs = json.loads(rows[-1])["epoch"] + 1 if rows else 0
    return {"path": repo_relative(folder), "steps": int(training.get("total_steps", training.get("steps", 0))),
            "seconds": float(training.get("total_seconds", training.get("seconds", 0.0))), "epochs": int(epochs)}
