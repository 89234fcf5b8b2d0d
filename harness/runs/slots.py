"""What a grid runs on: its target, loaded once, and its slots: AR plus one drafter per method (or
per ablation variant of it), built once and shared by every temperature of the grid."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash
from harness.core.machine_meta import contention_warning
from harness.core.target import Target, check_target_spec
from harness.runs.config import RunConfig
from harness.runs.record import AR_METHOD
from harness.runs.settings import method_overrides


@dataclass
class MethodSlot:
    name: str
    drafter: Any            # None for AR
    config: dict[str, Any]
    config_hash: str
    checkpoint_hash: str | None
    label: str = ""         # shown in progress; a variant's settings when one method runs in several configs


def load_target(cfg: RunConfig, console: Console) -> Target:
    """The one place a run loads its target, after checking that nothing else competes for the CPU."""
    check_target_spec(cfg.target)
    warn = contention_warning()
    if warn:
        console.print(f"[yellow]warning:[/] {warn}")
    with console.status(f"loading target {cfg.target}"):
        target = Target.load(cfg.target, cfg.device, cfg.dtype, cfg.chat_template, cfg.system_prompt, cfg.device_map)
    if cfg.compile:
        target.enable_compile()
    return target


def method_classes(methods: list[str]) -> dict[str, type]:
    """The Drafter class of each method (AR aside); an unknown name fails here, before loading."""
    from methods.registry import get_method

    return {m: get_method(m) for m in methods if m != AR_METHOD}


def build_slots(target: Target, classes: dict[str, type], cfg: RunConfig,
                variants: dict[str, dict[str, Any]] | None = None) -> list[MethodSlot]:
    """AR plus one drafter per method (or per variant of it), built once per grid: a drafter's
    state is per sequence (`begin` resets it) and nothing in it depends on the temperature, so
    every temperature of the grid reuses the same drafters."""
    slots = [MethodSlot(AR_METHOD, None, {}, config_hash({"method": AR_METHOD}), None)]
    for name, cls in classes.items():
        overrides = method_overrides(cls, cfg.settings, list(classes))
        for label, extra in (variants or {name: {}}).items():
            drafter = cls.create(target, {**overrides, **extra}, checkpoint=cfg.checkpoint if cls.trainable else None)
            if cfg.compile:
                drafter.enable_compile()
            ck = drafter.checkpoint_hash()
            h = config_hash({"method": name, "config": drafter.config, "checkpoint": ck})
            twin = next((s.label for s in slots if s.config_hash == h), None)
            if twin is not None:
                raise SpecbenchError(f"variants '{twin}' and '{label}' of {name} are the same config")
            slots.append(MethodSlot(name, drafter, drafter.config, h, ck, label))
    return slots


def resolved_methods(slots: list[MethodSlot]) -> dict[str, Any]:
    """meta.json's `methods_resolved`: each slot's full config, hashes and parameter count."""
    return {(s.label or s.name): {"config": s.config, "config_hash": s.config_hash, "checkpoint_hash": s.checkpoint_hash,
                                  "parameters": s.drafter.num_parameters() if s.drafter is not None else 0}
            for s in slots}
