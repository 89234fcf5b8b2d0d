"""One trainer for every method: a method supplies only `loss(batch)`.

The trainer owns data order, AdamW, warm-up + cosine schedule, gradient clipping, uniform input
feature noise (as EAGLE), bf16 autocast where the CPU has AMX/AVX512-BF16 (or on GPU), periodic
checkpoints and exact resume (the batch order is a function of seed and epoch, so a resumed run
sees the same batches as an uninterrupted one), held-out evaluation and a progress bar.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from harness.core.errors import SpecbenchError
from harness.core.timing import Clock
from harness.train.data import FeatureDataset, batches
from harness.train.memory import HeapTrimmer
from harness.train.state_commits import StateCommitter

TRIM_GROWTH_GIB = 4.0  # trim the heap when training's resident set grew this much (memory.py says why)


@dataclass
class TrainConfig:
    steps: int = 1500               # the same optimiser-step budget for every method by default
    lr: float = 1e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    tokens_per_batch: int = 4096
    max_len: int = 1024
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 0.5          # clip by value, as the EAGLE/Gumiho recipes do
    noise: float = 0.2              # uniform (U - 0.5) * noise * 512 / L on input features (EAGLE)
    autocast: str = "auto"          # auto | bf16 | off
    save_every: int = 100
    eval_every: int = 100           # held-out curve points (`cli.py curves`): has the budget flattened?
    eval_batches: int = 16          # ~60 k held-out tokens; 8 batches moved a head's top-1 by ~2 points
    seed: int = 0


def _use_bf16(mode: str, device: torch.device) -> bool:
    if mode == "off":
        return False
    if mode == "bf16" or device.type == "cuda":
        return True
    from harness.core.hardware import has_fast_bf16

    return has_fast_bf16()


def session_record(step: int) -> dict:
    """Where one training session (a start or a resume) ran: the step it began at, the code's
    commit and the machine, so a weight file says where and on what it was trained."""
    from harness.core.machine_meta import collect_meta

    meta = collect_meta()
    keep = ("commit", "dirty", "date", "cpu_model", "cpu_kind", "gpu", "torch_threads")
    return {"from_step": step, **{k: meta.get(k) for k in keep}, "torch": torch.__version__}


def load_state(path: Path) -> dict:
    """A trainer_state.pt as `Trainer.save` writes it, read with `weights_only=True`: a file that
    holds anything but tensors, state dicts and plain values is refused, never run. Files written
    before the sessions' torch version was stored as a plain string name it as a TorchVersion (a
    str subclass), which is allowed."""
    from torch.torch_version import TorchVersion

    try:
        with torch.serialization.safe_globals([TorchVersion]):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - an unpickling refusal, a truncated or foreign file: one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecbenchError(f"{path} is not a trainer state this code wrote ({reason[:200]}); delete it to train "
                             "from the start, or pass another --out") from None
    if not isinstance(state, dict) or not {"model", "opt", "sched", "step", "rng"} <= set(state):
        raise SpecbenchError(f"{path} is not a trainer state this code wrote; delete it to train from the start")
    return state


def lr_factor(cfg: TrainConfig, step: int) -> float:
    """The learning rate at `step` as a share of the peak: linear warm-up, then cosine to min_lr_ratio."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def to_device(batch, device: torch.device):
    """`batch` (a DistillBatch) with its tensors moved to `device`."""
    for name in ("input_ids", "features", "target_features", "loss_mask", "attention_mask", "layer_features"):
        if getattr(batch, name) is not None:
            setattr(batch, name, getattr(batch, name).to(device))
    return batch


def autocast_loss(drafter, batch, bf16: bool) -> dict[str, torch.Tensor]:
    """The drafter's loss terms on `batch`, under bf16 autocast when `bf16`."""
    with torch.autocast(drafter.target.device.type, dtype=torch.bfloat16, enabled=bf16):
        return drafter.loss(batch)


@torch.no_grad()
def held_out_metrics(drafter, valid: list, cfg: TrainConfig, bf16: bool) -> dict[str, float]:
    """The mean of each loss term (`val_<term>`: val_acc is next-token top-1) over the first
    `cfg.eval_batches` batches of the held-out sequences, in one fixed order; leaves `drafter` in eval mode."""
    drafter.eval()
    sums: dict[str, float] = {}
    n = 0
    for i, batch in enumerate(batches(valid, cfg.tokens_per_batch, cfg.max_len, 12345, 0)):
        if i >= cfg.eval_batches:
            break
        out = autocast_loss(drafter, to_device(batch, drafter.target.device), bf16)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    return {f"val_{k}": v / max(1, n) for k, v in sums.items()}


class Trainer:
    def __init__(self, drafter, data: FeatureDataset, cfg: TrainConfig, out: Path,
                 console: Console | None = None, prior: dict | None = None,
                 sources: list[dict] | None = None, commit_every_s: float = 0.0) -> None:
        self.drafter = drafter
        self.prior = prior  # the warm start's checkpoint {path, steps, seconds, epochs}, if any
        self.sources = sources or []  # the distill folders trained on: [{folder, shards}]
        self.sessions: list[dict] = []  # session_record of every start and resume
        self.data = data
        self.cfg = cfg
        self.out = Path(out)
        self.console = console or Console(stderr=True)
        self.params = [p for p in drafter.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        # A function of the config, not a bound method: the scheduler then holds no reference to
        # this trainer, so the trainer and its dataset (GBs of features) are freed as soon as it
        # is dropped instead of at the next cyclic garbage collection.
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, functools.partial(lr_factor, cfg))
        self.device = drafter.target.device
        self.clock = Clock(drafter.target.devices)  # a step's seconds include its queued GPU work
        self.bf16 = _use_bf16(cfg.autocast, self.device)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.seconds = 0.0
        self._rng = torch.get_rng_state()  # RNG as of the start of the next step: resume is exact
        # A training that spans sessions commits its state to git (harness/train/state_commits.py).
        self.committer = (StateCommitter(self.out, commit_every_s, f"{drafter.name} {self.out.name}")
                          if commit_every_s > 0 else None)

    # ------------------------------------------------------------------ state
    @property
    def state_path(self) -> Path:
        return self.out / "trainer_state.pt"

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        # Tensors, the optimiser's and scheduler's state dicts and JSON types only: a file that
        # `torch.load(weights_only=True)` reads back without running any code (`try_resume`).
        state = {"model": {k: v for k, v in self.drafter.state_dict().items() if not k.startswith("target.")},
                 "opt": self.opt.state_dict(), "sched": self.sched.state_dict(), "step": self.step,
                 "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "seconds": self.seconds,
                 "cfg": json.loads(json.dumps(asdict(self.cfg))), "rng": self._rng,
                 "sessions": json.loads(json.dumps(self.sessions))}
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.state_path)
        self.drafter.save_pretrained(self.out, training=self.summary())

    def try_resume(self) -> bool:
        if not self.state_path.exists():
            return False
        state = load_state(self.state_path)
        self.drafter.load_state_dict(state["model"], strict=False)
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.batch_in_epoch, self.seconds = state["batch_in_epoch"], state["seconds"]
        self.sessions = state.get("sessions", [])
        torch.set_rng_state(state["rng"])
        self._rng = state["rng"]
        self._trim_log()
        self.console.print(f"resuming {self.out} at step {self.step}/{self.cfg.steps}")
        return True

    def _commit_state(self, force: bool = False) -> None:
        if self.committer is not None:
            said = self.committer.maybe_commit(self.step, force)
            if said:
                self.console.print(said)

    def _trim_log(self) -> None:
        """Drop log rows past the resumed step: a killed run logged steps its last checkpoint does not hold,
        and the resumed run logs them again."""
        log = self.out / "train_log.jsonl"
        if not log.exists():
            return
        lines = log.read_text().splitlines()
        kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= self.step]
        if len(kept) != len(lines):
            tmp = log.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            tmp.replace(log)

    def summary(self) -> dict:
        epochs = self.epoch + (1 if self.batch_in_epoch else 0)  # data passes begun
        out = {"steps": self.step, "target_steps": self.cfg.steps, "seconds": round(self.seconds, 1),
               "epochs": epochs, "train_tokens": self.data.train_tokens, "config": asdict(self.cfg),
               "bf16_autocast": self.bf16, "data": self.sources, "trained_on": self.sessions}
        if self.prior:
            out.update(init_from=self.prior, total_steps=self.prior["steps"] + self.step,
                       total_seconds=round(self.prior["seconds"] + self.seconds, 1),
                       total_epochs=self.prior.get("epochs", 0) + epochs)
        return out

    # ------------------------------------------------------------------ loop
    def _noised(self, batch):
        if self.cfg.noise > 0 and getattr(self.drafter, "input_noise", True):
            length = batch.features.shape[1]
            noise = (torch.rand_like(batch.features) - 0.5) * self.cfg.noise * 512 / length
            batch.features = batch.features + noise
        return batch

    def _to(self, batch):
        return to_device(batch, self.device)

    def _tell_epoch(self) -> None:
        # Epoch-scheduled loss terms (Gumiho's MLP CE) count the passes of a warm start's checkpoint too.
        self.drafter.train_epoch = self.epoch + (self.prior or {}).get("epochs", 0)

    def _loss(self, batch) -> dict[str, torch.Tensor]:
        self._tell_epoch()
        return autocast_loss(self.drafter, batch, self.bf16)

    def evaluate(self) -> dict[str, float]:
        self._tell_epoch()
        out = held_out_metrics(self.drafter, self.data.valid, self.cfg, self.bf16)
        self.drafter.train()
        return out

    def _log(self, row: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "train_log.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    def train(self) -> dict:
        self.try_resume()
        if self.step < self.cfg.steps:
            self.sessions.append(session_record(self.step))
        self.drafter.train()
        heap = HeapTrimmer(TRIM_GROWTH_GIB)
        cols = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[losses]}")]
        try:
            with Progress(*cols, console=self.console) as progress:
                task = progress.add_task(f"train {self.drafter.name}", total=self.cfg.steps, completed=self.step,
                                         losses="")
                while self.step < self.cfg.steps:
                    for i, batch in enumerate(batches(self.data.train, self.cfg.tokens_per_batch, self.cfg.max_len,
                                                      self.cfg.seed, self.epoch)):
                        if i < self.batch_in_epoch:
                            continue  # resumed mid-epoch: these batches were already used
                        if self.step >= self.cfg.steps:
                            break
                        self._rng = torch.get_rng_state()
                        t0 = self.clock.now()
                        out = self._loss(self._to(self._noised(batch)))
                        self.opt.zero_grad(set_to_none=True)
                        out["loss"].backward()
                        torch.nn.utils.clip_grad_value_(self.params, self.cfg.grad_clip)
                        self.opt.step()
                        self.sched.step()
                        self.step += 1
                        self.batch_in_epoch = i + 1
                        self.seconds += self.clock.now() - t0
                        self._rng = torch.get_rng_state()
                        shown = {k: round(float(v.detach()), 4) for k, v in out.items()}
                        progress.update(task, completed=self.step,
                                        losses=" ".join(f"{k} {v:.3f}" for k, v in shown.items()))
                        row = {"step": self.step, "epoch": self.epoch, "lr": self.sched.get_last_lr()[0],
                               "tokens": batch.tokens, "seconds": round(self.seconds, 2), **shown}
                        if self.prior:  # a warm start's log continues its checkpoint's step count
                            row["total_step"] = self.prior["steps"] + self.step
                        rss = heap.after_step()
                        if rss is not None:
                            row["rss_gib"] = round(rss, 2)
                        evaluate = self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps
                        if evaluate:
                            row.update(self.evaluate())
                        self._log(row)
                        save = self.step % self.cfg.save_every == 0
                        if save:
                            self.save()
                            self._commit_state()
                        if evaluate or save:
                            heap.trim()  # evaluation and saving leave their own freed blocks behind
                    else:
                        self.epoch += 1
                        self.batch_in_epoch = 0
                        if not self.data.train:
                            raise RuntimeError("no training sequences")
        except KeyboardInterrupt:
            self.save()
            self._commit_state(force=True)
            self.console.print(f"[yellow]interrupted[/]: saved step {self.step}")  # the CLI says how to resume
            raise
        final = self.evaluate()
        self.save()
        return {**self.summary(), **final}
