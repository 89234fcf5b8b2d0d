"""What tables and plots show of a method, as a static table: display name, paper, year, colour
and table order of AR and every built-in method. Reports read it without importing torch or a
Drafter class (harness/report imports neither); tests/test_method_display.py holds it equal to what
each class declares (`methods/registry.py:method_info`, which `cli.py list` and check-method read).

A name not in the table (a plugin by entry point or `module:Class`, a method a test registers, an
old record's removed method) is read from its class through the registry, which imports it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodDisplay:
    """How a method is shown: its name in tables and legends, its citation, its one colour in
    every figure and its position in tables (lower first)."""

    name: str
    display_name: str
    paper: str
    year: int | None
    color: str
    order: int


BUILTIN: dict[str, MethodDisplay] = {d.name: d for d in (
    MethodDisplay("ar", "AR", "plain autoregressive decoding", None, "#7F7F7F", 0),
    MethodDisplay("pld", "Prompt lookup", "Saxena, 2023 (prompt lookup decoding)", 2023, "#E69F00", 10),
    MethodDisplay("lookahead", "Lookahead", "Fu et al., ICML 2024", 2024, "#56B4E9", 15),
    MethodDisplay("medusa", "Medusa", "Cai et al., ICML 2024", 2024, "#009E73", 30),
    MethodDisplay("hydra", "Hydra", "Ankner et al., COLM 2024", 2024, "#B8A200", 40),
    MethodDisplay("eagle", "EAGLE", "Li et al., ICML 2024", 2024, "#0072B2", 50),
    MethodDisplay("eagle2", "EAGLE-2", "Li et al., EMNLP 2024", 2024, "#D55E00", 60),
    MethodDisplay("eagle3", "EAGLE-3", "Li et al., 2025 (arXiv 2503.01840)", 2025, "#882255", 65),
    MethodDisplay("gumiho", "Gumiho", "Li et al., ICML 2025", 2025, "#CC79A7", 70),
    MethodDisplay("sps", "SpS", "Leviathan et al., ICML 2023; Chen et al., 2023", 2023, "#000000", 20),
    MethodDisplay("recycling", "Token Recycling", "Luo et al., ACL 2025 (arXiv 2408.08696)", 2025, "#999933", 15),
    MethodDisplay("samd", "SAM-Decoding", "Hu et al., ACL 2025 (arXiv 2411.10666)", 2025, "#AA4499", 17),
    MethodDisplay("rest", "REST", "He et al., NAACL 2024", 2024, "#88CCEE", 13),
)}


def method_display(name: str) -> MethodDisplay:
    """How `name` is shown: the table's entry, else what its class declares (see the module docstring)."""
    if name in BUILTIN:
        return BUILTIN[name]
    from methods.registry import method_info   # a plugin or an unknown name: imports its class, if any

    info = method_info(name)
    return MethodDisplay(name, info.display_name, info.paper, info.year, info.color, info.order)
