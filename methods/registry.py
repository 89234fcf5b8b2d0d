"""Method name -> Drafter class, imported lazily so that `cli.py list` and unrelated methods never
pay for (or break on) a method's heavy imports."""
from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass

from harness.core.errors import unknown

# name -> "module:Class"; "ar" (plain decoding) is not a drafter and is handled by the runner.
_ENTRIES: dict[str, str] = {
    "pld": "methods.pld:PromptLookupDrafter",
    "medusa": "methods.medusa:Medusa",
    "hydra": "methods.hydra:Hydra",
    "eagle": "methods.eagle:Eagle",
    "eagle2": "methods.eagle2:Eagle2",
    "gumiho": "methods.gumiho:Gumiho",
    "sps": "methods.sps:SpeculativeSampling",
}
_CLASSES: dict[str, type] = {}


def register(name: str, cls_or_path: type | str) -> None:
    """Add a method (tests register their oracle drafter this way)."""
    if isinstance(cls_or_path, str):
        _ENTRIES[name] = cls_or_path
    else:
        _CLASSES[name] = cls_or_path


def method_names() -> list[str]:
    return sorted({*_ENTRIES, *_CLASSES})


def get_method(name: str) -> type:
    if name in _CLASSES:
        return _CLASSES[name]
    if name not in _ENTRIES:
        raise unknown("method", name, ["ar", *method_names()])
    module, cls = _ENTRIES[name].split(":")
    _CLASSES[name] = getattr(importlib.import_module(module), cls)
    return _CLASSES[name]


@dataclass(frozen=True)
class MethodInfo:
    """What the harness shows of a method, declared once as class attributes of its Drafter."""

    name: str
    display_name: str
    paper: str = ""
    year: int | None = None
    color: str = ""
    order: int = 100
    trainable: bool = False
    acceptance_rules: tuple[str, ...] = ("greedy", "lossless")
    checkpoint_layout: str = ""


AR_INFO = MethodInfo("ar", "AR", "plain autoregressive decoding", None, "#7F7F7F", 0)
# Colours for methods that declare none (external drafters, old records of removed methods).
_SPARE_COLORS = ("#882255", "#44AA99", "#332288", "#117733", "#AA4499", "#661100", "#6699CC")


def spare_color(name: str) -> str:
    """A stable colour for a method that declares none."""
    return _SPARE_COLORS[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(_SPARE_COLORS)]


def method_info(name: str) -> MethodInfo:
    """The declared metadata of `name`; a name no installed method answers to (an old record)
    gets its name as display name and a stable colour, so old run folders still render."""
    if name == "ar":
        return AR_INFO
    try:
        cls = get_method(name)
    except Exception:  # noqa: BLE001 - unknown or broken method: render it plainly
        return MethodInfo(name, name, color=spare_color(name))
    return MethodInfo(
        name=name, display_name=cls.display_name or name, paper=cls.paper, year=cls.year,
        color=cls.color or spare_color(name), order=cls.order, trainable=bool(cls.trainable),
        acceptance_rules=tuple(cls.acceptance_rules), checkpoint_layout=cls.checkpoint_layout,
    )
