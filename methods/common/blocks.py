"""Building blocks several drafters' heads are made of."""
from __future__ import annotations

import torch
from torch import nn

from harness.core.packed_linear import apply_linear


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W zero-initialised (the identity at initialisation): Medusa's head layer,
    reused by Hydra and Gumiho. Parameter names (`linear.*`) are the released checkpoints'."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(apply_linear(self.linear, x))
