"""The papers' official checkpoint layouts, read and written through one key map per method.

A released drafter names its tensors as the official code builds its module (EAGLE's `fc.*` and
`layers.0.*`, Medusa's `{i}.0.linear.*`, ...). Each learned method declares one `KeyMap` between
those names and ours: its `load_official` reads a released file through it, and `cli.py export
--layout official` writes our weights through the same map backwards, so the two directions
cannot drift apart. What a layout cannot say about one of our drafters (a draft vocabulary, a
block the official code shares) is a departure: one line each, printed by the export and
recorded in the exported config.json.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.core.errors import SpecbenchError

INDEX = "{i}"  # in a key template: a number, the same on both sides of a pair
EXPORT_KEY = "specbench_export"  # the exported config.json's record of where the weights came from


def _template(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix).replace(re.escape(INDEX), r"(\d+)"))


def _rename(key: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    """`key` with the first matching `src` prefix of (src, dst) replaced by `dst`, else None."""
    for src, dst in pairs:
        m = _template(src).match(key)
        if m:
            return (dst.replace(INDEX, m.group(1)) if m.groups() else dst) + key[m.end():]
    return None


@dataclass(frozen=True)
class KeyMap:
    """Official key prefixes <-> ours. `pairs`: (official prefix, our prefix), "{i}" a number kept;
    `official_only`: substrings of official keys holding what our drafters do not keep (a copy of
    the target's embedding, rotary buffers): skipped when read, supplied by the exporter when
    written; `ours_only`: our keys the layout has no place for (a departure the exporter reports);
    `read_aliases`: other official spellings of a pair's prefix, read only (EAGLE-3's `layers.0.`)."""

    pairs: tuple[tuple[str, str], ...]
    official_only: tuple[str, ...] = ()
    ours_only: tuple[str, ...] = ()
    read_aliases: tuple[tuple[str, str], ...] = ()

    def to_ours(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A released state dict under our names; a key no pair knows is kept as it is, so the
        strict load that follows names it."""
        out = {}
        for key, value in state.items():
            if any(part in key for part in self.official_only):
                continue
            out[_rename(key, self.read_aliases + self.pairs) or key] = value
        return out

    def to_official(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our state dict under the official names, without the `ours_only` keys."""
        out = {}
        flipped = tuple((ours, official) for official, ours in self.pairs)
        for key, value in state.items():
            if key in self.ours_only:
                continue
            name = _rename(key, flipped)
            if name is None:
                raise SpecbenchError(f"our tensor '{key}' has no place in the official layout")
            out[name] = value
        return out


@dataclass
class OfficialFiles:
    """A drafter in its paper's layout: `weights` saved by torch.save as `weights_file` (what the
    official loaders torch.load; one tensor under several keys stays one tensor, as in the
    releases), `config` as config.json, and the `departures` the layout could not express."""

    weights: dict[str, torch.Tensor]
    weights_file: str
    config: dict[str, Any]
    departures: list[str] = field(default_factory=list)

    def write(self, folder: Path, provenance: dict[str, Any]) -> list[Path]:
        """Write both files into `folder`; config.json also records `provenance` and the departures
        under `specbench_export` (the official config classes keep unknown keys as attributes)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = folder / self.weights_file
        torch.save(self.weights, weights)
        config = folder / "config.json"
        record = {**self.config, EXPORT_KEY: {**provenance, "departures": self.departures}}
        config.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        return [weights, config]


def exported(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as the export writes it: float32 for floating point (our bf16 weights are exact in
    it; the official loaders cast to the base model's dtype), ids and masks as they are."""
    tensor = tensor.detach().cpu()
    return tensor.float() if tensor.is_floating_point() else tensor


def target_field(target_config, key: str):
    """A field of the target's config as a released config.json names it (transformers 5 keeps
    rope_theta in rope_parameters); None where it has none."""
    if key == "rope_theta" and isinstance(getattr(target_config, "rope_parameters", None), dict):
        return target_config.rope_parameters.get("rope_theta")
    return getattr(target_config, key, None)


def vocab_departure(drafter, peer_head: str) -> list[str]:
    """The departure of a pruned draft vocabulary the layout cannot hold (`peer_head`: where the
    official code drafts over the full vocabulary, file:line)."""
    n = drafter.draft_vocab_size
    if not n:
        return []
    return [f"draft vocabulary: ours drafts from {n:,} of the target's {drafter.target.vocab_size:,} ids "
            f"(`draft_ids`), the official code from all of them ({peer_head}); written without it (ours "
            f"decodes this folder, --checkpoint, at draft_vocab=0)"]
