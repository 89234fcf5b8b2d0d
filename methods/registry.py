"""Method name -> Drafter class, and what the harness shows of each method: the one place the harness
reaches a method (tables, plots, training, bench and `cli.py list` read nothing else).

A method is named three ways:
  - a built-in name (`_ENTRIES`, imported lazily so that `cli.py list` and unrelated methods never
    pay for, or break on, a method's heavy imports);
  - the name of an entry point in the `specbench.methods` group of an installed package
    (`ngram = "ngram_drafter.drafter:NgramDrafter"` in its pyproject; examples/ngram_drafter);
  - `module:Class`, any importable Drafter subclass, e.g. `--method my_pkg.my_module:MyDrafter`.
A built-in name wins over an entry point of the same name. Records keep the name as given, so a
run folder of a `module:Class` method renders wherever that module imports.
"""
from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from typing import Any
from functools import lru_cache
from importlib import metadata

from harness.core.errors import SpecbenchError, unknown
from methods.common import method_lookup

ENTRY_POINT_GROUP = "specbench.methods"

# name -> "module:Class"; "ar" (plain decoding) is not a drafter and is handled by the runner.
_ENTRIES: dict[str, str] = {
    "pld": "methods.pld:PromptLookupDrafter",
    "lookahead": "methods.lookahead:Lookahead",
    "medusa": "methods.medusa:Medusa",
    "hydra": "methods.hydra:Hydra",
    "eagle": "methods.eagle:Eagle",
    "eagle2": "methods.eagle2:Eagle2",
    "eagle3": "methods.eagle3:Eagle3",
    "gumiho": "methods.gumiho:Gumiho",
    "sps": "methods.sps:SpeculativeSampling",
    "recycling": "methods.recycling:TokenRecycling",
    "samd": "methods.samd:SamDecoding",
    "rest": "methods.rest:Rest",
}
_CLASSES: dict[str, type] = {}   # built-ins once imported, and registered classes
_LOADED: dict[str, type] = {}    # entry points and module:Class paths once imported


def register(name: str, cls_or_path: type | str) -> None:
    """Add a method (tests register their oracle drafter this way)."""
    if isinstance(cls_or_path, str):
        _ENTRIES[name] = cls_or_path
    else:
        _CLASSES[name] = cls_or_path


@lru_cache(maxsize=1)
def plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    """Installed packages' `specbench.methods` entry points by name (read once per process)."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _plugins() -> dict[str, metadata.EntryPoint]:
    """Entry points whose names no built-in or registered method takes."""
    return {n: ep for n, ep in plugin_entry_points().items() if n not in _ENTRIES and n not in _CLASSES}


def is_class_path(name: str) -> bool:
    """Whether `name` is a `module:Class` path rather than a method name."""
    return ":" in name


def method_names() -> list[str]:
    """Built-in, registered and installed (entry point) method names."""
    return sorted({*_ENTRIES, *_CLASSES, *_plugins()})


def method_source(name: str) -> str:
    """Where a method comes from: "built-in", "entry point (<distribution>)" or "module:Class"."""
    if is_class_path(name):
        return "module:Class"
    if name in _ENTRIES or name in _CLASSES:
        return "built-in" if _ENTRIES.get(name, "").startswith("methods.") else "registered"
    ep = _plugins().get(name)
    return f"entry point ({distribution(ep)})" if ep is not None else "unknown"


def distribution(ep: metadata.EntryPoint) -> str:
    """The installed package that declares `ep` (its value when the metadata does not say)."""
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else ep.value


def load_class(path: str, what: str) -> type:
    """The Drafter subclass at `module:Class`; one-line errors for a missing module, class or base."""
    from methods.common.base import Drafter

    module, _, qualname = path.partition(":")
    if not module or not qualname:
        raise SpecbenchError(f"{what} '{path}': write it as package.module:ClassName")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise SpecbenchError(f"{what} '{path}': cannot import {module} ({type(e).__name__}: {e}); "
                             "install its package or put it on PYTHONPATH") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise SpecbenchError(f"{what} '{path}': {module} has no '{qualname}'")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Drafter)):
        raise SpecbenchError(f"{what} '{path}' is not a Drafter subclass (methods.common.base.Drafter)")
    return obj


def get_method(name: str) -> type:
    """The Drafter class of a method name, entry point name or `module:Class` path."""
    if name in _CLASSES:
        return _CLASSES[name]
    if name in _ENTRIES:
        _CLASSES[name] = load_class(_ENTRIES[name], f"method '{name}'")
        return _CLASSES[name]
    if name not in _LOADED:
        if is_class_path(name):
            _LOADED[name] = load_class(name, "method")
        elif name in _plugins():
            ep = _plugins()[name]
            _LOADED[name] = load_class(ep.value, f"method '{name}' (entry point of {distribution(ep)})")
        else:
            raise unknown("method", name, ["ar", *method_names(), "<package.module:Class>"])
    return _LOADED[name]


method_lookup.install(get_method)  # how a composite drafter (samd's auxiliary) finds another method


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
    summary: str = ""     # the first line of the class's docstring (or its module's)
    source: str = ""      # method_source(name)


AR_INFO = MethodInfo("ar", "AR", "plain autoregressive decoding", None, "#7F7F7F", 0,
                     summary="plain decoding, always run as the baseline", source="built-in")
# Colours for methods that declare none (external drafters, old records of removed methods).
_SPARE_COLORS = ("#882255", "#44AA99", "#332288", "#117733", "#AA4499", "#661100", "#6699CC")


def spare_color(name: str) -> str:
    """A stable colour for a method that declares none."""
    return _SPARE_COLORS[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(_SPARE_COLORS)]


def summary_line(cls: type) -> str:
    """The first line of a Drafter class's docstring, else of its module's."""
    import sys

    doc = cls.__doc__ or getattr(sys.modules.get(cls.__module__), "__doc__", None) or ""
    lines = doc.strip().splitlines()
    return lines[0] if lines else ""


def method_departures(name: str, config: dict[str, Any]) -> list[str]:
    """How a record's method config departs from its paper's algorithm (`Drafter.departures`); []
    for AR, the paper's form, or a method this install does not have."""
    if name == "ar" or not config:
        return []
    try:
        return list(get_method(name).departures(config))
    except Exception:  # noqa: BLE001 - unknown or broken method: no label
        return []


def method_info(name: str) -> MethodInfo:
    """The declared metadata of `name`; a name no installed method answers to (an old record)
    gets its name as display name and a stable colour, so old run folders still render."""
    if name == "ar":
        return AR_INFO
    try:
        cls = get_method(name)
    except Exception:  # noqa: BLE001 - unknown or broken method: render it plainly
        return MethodInfo(name, name, color=spare_color(name), source=method_source(name))
    return MethodInfo(
        name=name, display_name=cls.display_name or cls.name or name, paper=cls.paper, year=cls.year,
        color=cls.color or spare_color(name), order=cls.order, trainable=bool(cls.trainable),
        acceptance_rules=tuple(cls.acceptance_rules), checkpoint_layout=cls.checkpoint_layout,
        summary=summary_line(cls), source=method_source(name),
    )
