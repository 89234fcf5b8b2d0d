"""Method name -> Drafter class, imported lazily so that `cli.py list` and unrelated methods never
pay for (or break on) a method's heavy imports."""
from __future__ import annotations

import importlib

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
