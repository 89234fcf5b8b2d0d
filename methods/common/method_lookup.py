"""Another method's Drafter class by name, for a drafter built on one (SAM-Decoding's auxiliary
drafter: `--set samd.aux=recycling|eagle2`).

A method file never imports another method or the registry (tests/test_layers.py), so the
registry installs its own lookup here when it is imported: whoever built the composite drafter
reached its class through the registry, so the lookup is always there by then. This module
imports nothing heavy: the registry imports it at load, and `cli.py list` stays cheap.
"""
from __future__ import annotations

from collections.abc import Callable

from harness.core.errors import SpecbenchError

_lookup: Callable[[str], type] | None = None


def install(lookup: Callable[[str], type]) -> None:
    """Called once by methods/registry.py with its `get_method`."""
    global _lookup
    _lookup = lookup


def method_class(name: str) -> type:
    """The Drafter class of method `name` (an unknown name is the registry's one-line error)."""
    if _lookup is None:
        raise SpecbenchError(f"no method registry is loaded to find '{name}': import methods.registry first")
    return _lookup(name)
