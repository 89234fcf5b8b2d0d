"""What each config key of a method takes, checked before any model is built.

A method declares the keys that need more than their default says in `config_types`, next to
its `defaults` (`Takes`: an integer >= 2 or "auto", one of a few words, a number in a range);
every other key takes what its default is (an integer default takes integers, a boolean
booleans, a list lists; a None default anything). `check_values` is the one check: the Drafter
base class runs it in `resolve_config`, which every command reaches before it loads a model
(`--set`, `--tree-budget`, an ablation's sweep, a checkpoint's stored config), so a value the
method cannot take is one line, never a traceback from inside `propose`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from harness.core.errors import SpecbenchError

# JSON kinds a value may be, by name.
KINDS = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
         "list": "a list", "dict": "an object", "null": "null"}


@dataclass(frozen=True)
class Takes:
    """The values one config key takes: any of `kinds`, or one of `words` (strings); numbers
    within [low, high]. No kinds and no words: anything."""

    kinds: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None

    def accepts(self, value: Any) -> bool:
        if not self.kinds and not self.words:
            return True
        if isinstance(value, str) and value in self.words:
            return True
        return any(_is(kind, value) and self._in_range(value) for kind in self.kinds)

    def _in_range(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        return math.isfinite(value) and (self.low is None or value >= self.low) and (
            self.high is None or value <= self.high)

    def describe(self) -> str:
        """'an integer >= 2, or auto'."""
        parts = []
        for kind in self.kinds:
            text = KINDS[kind]
            if kind in ("int", "number"):
                if self.low is not None and self.high is not None:
                    text += f" in [{self.low:g}, {self.high:g}]"
                elif self.low is not None:
                    text += f" >= {self.low:g}"
                elif self.high is not None:
                    text += f" <= {self.high:g}"
            parts.append(text)
        if self.words:
            parts.append(("one of " if len(self.words) > 1 else "") + ", ".join(self.words))
        return ", or ".join(parts)


def _is(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"bool": bool, "str": str, "list": (list, tuple), "dict": dict,
                              "null": type(None)}[kind])


def integer(low: float | None = None, high: float | None = None, words: tuple[str, ...] = ()) -> Takes:
    return Takes(("int",), words, low, high)


def number(low: float | None = None, high: float | None = None) -> Takes:
    return Takes(("number",), (), low, high)


def one_of(*words: str) -> Takes:
    return Takes((), words)


def kinds(*names: str) -> Takes:
    return Takes(names)


def inferred(default: Any) -> Takes:
    """What a key takes when its method declares nothing: the kind of its default."""
    for kind in ("bool", "int", "number", "str", "list", "dict"):
        if _is(kind, default):
            return Takes((kind,))
    return Takes()  # a None default: anything


def declared(cls: type, key: str) -> Takes:
    """`key`'s declaration on `cls` or a base class (the nearest wins), else what its default says."""
    for klass in cls.__mro__:
        types = klass.__dict__.get("config_types") or {}
        if key in types:
            return types[key]
    return inferred(cls.defaults.get(key))


def check_values(cls: type, overrides: dict[str, Any]) -> None:
    """Refuse, in one line naming the key and what it takes, an override `cls` cannot take."""
    for key, value in overrides.items():
        takes = declared(cls, key)
        if not takes.accepts(value):
            shown = json.dumps(value) if not isinstance(value, str) else repr(value)
            example = cls.defaults.get(key)
            hint = f" (default {json.dumps(example)})" if example is not None else ""
            raise SpecbenchError(f"method '{cls.name}': {key}={shown} is not {takes.describe()}{hint}")
