"""The Drafter interface every method implements, and its config handling.

A drafter proposes a tree of draft tokens under the root; it never calls the target's forward
itself (it may reuse the target's frozen embedding and LM head). The shared loop in
`harness/decode.py` verifies, commits and then shows the drafter what was accepted.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from harness.core.errors import SpecbenchError, did_you_mean
from harness.core.hashing import config_hash
from harness.core.paths import REPO_ROOT
from harness.core.tree import DraftTree
from methods.checkpoint_io import check_shapes, read_config, read_weights, resolve_checkpoint

UNREACHABLE = 1 << 30  # the rank of a token a drafter can never propose


class Drafter(nn.Module):
    """Base class. Subclasses set `name`, `defaults` (every config key with its default) and
    `arch_keys` (keys that change the weights: they are part of the checkpoint hash; the others
    are inference keys, so sweeping them never retrains)."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    arch_keys: ClassVar[tuple[str, ...]] = ()
    trainable: ClassVar[bool] = False

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.target = target
        self.config = self.resolve_config(config or {})

    @classmethod
    def resolve_config(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """Defaults updated with `overrides`; an unknown key is a one-line error."""
        for key in overrides:
            if key not in cls.defaults:
                raise SpecbenchError(
                    f"method '{cls.name}' has no config key '{key}'{did_you_mean(key, cls.defaults)}; "
                    f"keys: {', '.join(sorted(cls.defaults))}"
                )
        return {**cls.defaults, **overrides}

    @classmethod
    def arch_hash(cls, config: dict[str, Any]) -> str:
        return config_hash({k: config[k] for k in cls.arch_keys})

    @classmethod
    def create(cls, target, overrides: dict[str, Any], checkpoint: str | None = None) -> "Drafter":
        """Build the drafter for a run. Learned methods override this to find and load weights."""
        if checkpoint is not None and not cls.trainable:
            raise SpecbenchError(f"method '{cls.name}' is training-free and takes no --checkpoint")
        return cls(target, overrides).eval()

    # ---- the decoding protocol ------------------------------------------------------------
    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        """A new sequence: `prefill` holds the prompt's target hidden states; `root` is the first new token."""

    def propose(self, ctx) -> DraftTree:  # ctx: harness.core.decode.DraftContext
        raise NotImplementedError

    def observe(self, step) -> None:  # step: harness.core.decode.Acceptance
        """Accepted tokens and their target features after a verify step."""

    # ---- training and checkpoints (learned drafters) -----------------------------------------
    def loss(self, batch) -> dict[str, torch.Tensor]:
        raise SpecbenchError(f"method '{self.name}' is training-free: there is nothing to train")

    def checkpoint_hash(self) -> str | None:
        """Hash of the weights in use (None for training-free methods)."""
        return None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def checkpoint_search_paths(target_name: str, method: str) -> list[Path]:
    """Where a drafter's weights are looked for, in order (after an explicit --checkpoint)."""
    import os

    from harness.core.target import cache_root

    paths = []
    if os.environ.get("SPECBENCH_CHECKPOINTS"):
        paths.append(Path(os.environ["SPECBENCH_CHECKPOINTS"]) / target_name / method)
    paths.append(REPO_ROOT / "checkpoints" / target_name / method)
    paths.append(cache_root() / "checkpoints" / target_name / method)
    return paths


class LearnedDrafter(Drafter):
    """A drafter with weights: checkpoint folders hold `config.json` (method, architecture config,
    target name, vocab hash, sizes, training summary) and `model.safetensors` with the drafter's
    own weights only (the target's frozen embedding and LM head are never copied)."""

    trainable = True
    default_lr: ClassVar[float] = 1e-3
    weights_from: ClassVar[str | None] = None  # EAGLE-2 reads EAGLE's weights

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        # Draft vocabulary (EAGLE-3's idea): draft logits over the N most frequent answer tokens
        # of the training data only. On SmolLM2 8,192 of 49,152 ids cover 99.2% of distilled
        # answer tokens, and the 49k-column softmax is what dominates draft training and the
        # draft's per-step cost on a CPU. Verification still uses the full vocab, so greedy
        # output is unchanged and sampling stays lossless (q is simply zero outside the set).
        n = int(self.config.get("draft_vocab") or 0)
        if 0 < n < target.vocab_size and self.uses_target_head():
            # Placeholder ids until `set_draft_vocab` (training) or the checkpoint fills them.
            self.register_buffer("draft_ids", torch.arange(n, device=target.device))
        self._head_cache: tuple | None = None

    def uses_target_head(self) -> bool:
        """Whether draft logits come from the target's frozen LM head (where a draft vocab applies):
        always, unless a method's `share_lm_head` is off (Medusa/Hydra heads with their own projection)."""
        return bool(self.config.get("share_lm_head", True))

    @property
    def draft_vocab_size(self) -> int:
        ids = getattr(self, "draft_ids", None)
        return 0 if ids is None else int(ids.numel())

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Use these target token ids (exactly `draft_vocab` of them) as the draft vocabulary."""
        if ids.numel() != self.draft_vocab_size:
            raise SpecbenchError(f"draft vocab needs {self.draft_vocab_size} ids, got {ids.numel()}")
        self.draft_ids.copy_(ids.sort().values.to(self.draft_ids.device))

    def _head(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(LM-head rows of the draft vocab, their bias, target id -> draft index or -1), cached
        until the ids change (a checkpoint load or `set_draft_vocab` bumps the buffer's version)."""
        head = self.target.lm_head
        key = (self.draft_ids._version, self.draft_ids.data_ptr(), head.weight.dtype, head.weight.data_ptr())
        if self._head_cache is None or self._head_cache[0] != key:
            ids = self.draft_ids
            bias = getattr(head, "bias", None)
            t2d = torch.full((self.target.vocab_size,), -1, dtype=torch.long, device=ids.device)
            t2d[ids] = torch.arange(ids.numel(), device=ids.device)
            self._head_cache = (key, head.weight.detach().index_select(0, ids),
                                None if bias is None else bias.detach().index_select(0, ids), t2d)
        return self._head_cache[1:]

    def _vocab_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Frozen-LM-head logits over the draft vocab (column j is target id draft_ids[j]), or
        over the full vocab when there is no draft vocab."""
        h = hidden.to(self.target.dtype)
        if not self.draft_vocab_size:
            return self.target.project(h)
        w, b, _ = self._head()
        return torch.nn.functional.linear(h, w, b)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the full target vocab from the frozen LM head; ids outside the draft
        vocab get -inf, so top-k, softmax and sampling never pick them."""
        z = self._vocab_logits(hidden)
        if not self.draft_vocab_size:
            return z
        out = z.new_full((*z.shape[:-1], self.target.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.draft_ids, z)

    def draft_topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs, target token ids) of the k best draft tokens per row: the same values as
        `draft_logits(...).log_softmax(-1).topk(k)`, computed over the draft vocab only, so no
        full-vocab row is built, normalised or searched (the greedy tree drafters' hot path)."""
        top = self._vocab_logits(hidden).float().log_softmax(-1).topk(k)
        ids = self.draft_ids[top.indices] if self.draft_vocab_size else top.indices
        return top.values, ids

    def vocab_ranks(self, hidden: torch.Tensor, labels: torch.Tensor, proj: nn.Module | None = None) -> torch.Tensor:
        """Rank of each label among the draft logits of `hidden` (0 = the draft's top-1), through
        `proj` (a head's own vocab projection) or the frozen LM head over the draft vocab; a label
        the drafter cannot propose (outside the draft vocab) gets UNREACHABLE."""
        if proj is not None:
            z = proj(hidden).float()
        else:
            z = self._vocab_logits(hidden).float()
            if self.draft_vocab_size:
                labels = self._head()[2][labels]
        at = z.gather(-1, labels.clamp_min(0)[..., None])
        ranks = (z > at).sum(-1)
        return ranks.masked_fill(labels < 0, UNREACHABLE)

    def head_ce(self, pred: torch.Tensor, mask: torch.Tensor, *, target_hidden: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`frozen_head_ce` through the frozen LM head restricted to the draft vocab: soft targets
        are the target's distribution renormalised over it; a hard label outside it is masked."""
        from harness.train.losses import frozen_head_ce

        if not self.draft_vocab_size:
            return frozen_head_ce(pred, self.target.lm_head.weight, mask, target_hidden=target_hidden, labels=labels)
        w, _, t2d = self._head()
        if labels is not None:
            labels = t2d[labels]
            mask = mask * (labels >= 0).to(mask.dtype)
        return frozen_head_ce(pred, w, mask, target_hidden=target_hidden, labels=labels)

    @classmethod
    def checkpoint_name(cls, config: dict[str, Any]) -> str:
        base = cls.weights_from or cls.name
        defaults = {k: cls.defaults[k] for k in cls.arch_keys}
        if {k: config[k] for k in cls.arch_keys} == defaults:
            return base
        return f"{base}-{cls.arch_hash(config)}"

    def checkpoint_hash(self) -> str | None:
        return getattr(self, "_weights_hash", None)

    def save_pretrained(self, path: str | Path, training: dict | None = None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, str(path / "model.safetensors"))
        meta = {"format": "specbench", "method": self.weights_from or self.name,
                "arch": {k: self.config[k] for k in self.arch_keys}, "target": self.target.name,
                "vocab_hash": self.target.vocab_hash(), "hidden_size": self.target.hidden_size,
                "vocab_size": self.target.vocab_size, "parameters": self.num_parameters(), "training": training}
        (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, path: str | Path, target, overrides: dict[str, Any] | None = None) -> "LearnedDrafter":
        folder = resolve_checkpoint(path)
        meta = read_config(folder, cls.weights_from or cls.name)
        if meta.get("format") != "specbench":
            drafter = cls.load_official(folder, target, overrides or {})
        else:
            cls.check_meta(meta, folder, target)
            # `decode` holds inference defaults fitted to these weights (a static tree calibrated to
            # the heads, see harness/tree_search.py); --set still overrides them.
            drafter = cls(target, {**meta.get("arch", {}), **meta.get("decode", {}), **(overrides or {})})
            drafter.load_weights(folder / "model.safetensors")
        return drafter.eval()  # drafters decode in eval mode (Hydra's heads have dropout)

    @classmethod
    def check_meta(cls, meta: dict[str, Any], folder: Path, target) -> None:
        """A specbench checkpoint's config.json must name this method and fit `target` (sizes, tokenizer)."""
        want = cls.weights_from or cls.name
        if meta.get("method") != want:
            raise SpecbenchError(f"{folder} holds '{meta.get('method')}' weights, not '{want}'")
        if meta.get("hidden_size") != target.hidden_size or meta.get("vocab_size") != target.vocab_size:
            raise SpecbenchError(
                f"{folder} was trained for hidden {meta.get('hidden_size')} / vocab {meta.get('vocab_size')}, "
                f"target '{target.name}' has {target.hidden_size} / {target.vocab_size}: train one for this target")
        if meta.get("vocab_hash") not in (None, target.vocab_hash()):
            raise SpecbenchError(f"{folder} was trained with another tokenizer than target '{target.name}'")

    def load_weights(self, file: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Load (a mapped) state dict strictly, cast to the target's dtype, and hash it."""
        import hashlib

        state = state if state is not None else read_weights(file, self.weights_from or self.name)
        self.load_state_strictly(state, file)
        h = hashlib.sha256()
        for k in sorted(state):
            h.update(k.encode())
            h.update(state[k].float().numpy().tobytes()[:4096])
            h.update(str(tuple(state[k].shape)).encode())
        self._weights_hash = h.hexdigest()[:12]
        self.to(device=self.target.device, dtype=self.target.dtype)

    def load_state_strictly(self, state: dict[str, torch.Tensor], file: Path) -> None:
        """Copy `state` into this drafter's parameters (cast to their dtype); every key and shape must fit."""
        check_shapes(state, self.state_dict(), file, self.weights_from or self.name, self.target.name)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise SpecbenchError(f"{file}: weights do not fit '{self.name}' as configured "
                                 f"(missing {missing[:3]}, unexpected {unexpected[:3]})")

    @classmethod
    def load_official(cls, folder: Path, target, overrides: dict[str, Any]) -> "LearnedDrafter":
        raise SpecbenchError(f"{folder} is not a specbench checkpoint and '{cls.name}' has no official-layout loader")

    @classmethod
    def create(cls, target, overrides: dict[str, Any], checkpoint: str | None = None) -> "Drafter":
        if checkpoint:
            return cls.from_pretrained(checkpoint, target, overrides)
        return cls.from_pretrained(cls.find_checkpoint(target.name, overrides), target, overrides)

    @classmethod
    def find_checkpoint(cls, target_name: str, overrides: dict[str, Any]) -> Path:
        """The folder of this method's trained weights (for this architecture) on `target_name`."""
        name = cls.checkpoint_name(cls.resolve_config(overrides))
        for p in checkpoint_search_paths(target_name, name):
            if (p / "model.safetensors").exists() or (p / "pytorch_model.bin").exists():
                return p
        raise SpecbenchError(
            f"no trained weights for '{cls.name}' on target '{target_name}' (looked in "
            f"{', '.join(str(p) for p in checkpoint_search_paths(target_name, name))}); train them with "
            f"`python cli.py train --method {cls.weights_from or cls.name} --target {target_name}` or pass --checkpoint")
