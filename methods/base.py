"""The Drafter interface every method implements, and its config handling.

A drafter proposes a tree of draft tokens under the root; it never calls the target's forward
itself (it may reuse the target's frozen embedding and LM head). The shared loop in
`harness/decode.py` verifies, commits and then shows the drafter what was accepted.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from harness.errors import SpecbenchError, did_you_mean
from harness.results import config_hash
from harness.tree import DraftTree


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
        return cls(target, overrides)

    # ---- the decoding protocol ------------------------------------------------------------
    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        """A new sequence: `prefill` holds the prompt's target hidden states; `root` is the first new token."""

    def propose(self, ctx) -> DraftTree:  # ctx: harness.decode.DraftContext
        raise NotImplementedError

    def observe(self, step) -> None:  # step: harness.decode.Acceptance
        """Accepted tokens and their target features after a verify step."""

    # ---- training and checkpoints (learned drafters) -----------------------------------------
    def loss(self, batch) -> dict[str, torch.Tensor]:
        raise SpecbenchError(f"method '{self.name}' is training-free: there is nothing to train")

    def checkpoint_hash(self) -> str | None:
        """Hash of the weights in use (None for training-free methods)."""
        return None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
