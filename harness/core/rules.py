"""The acceptance rules by name (harness/core/verify.py applies them): which exist, which are lossy,
which a temperature defaults to, and which a temperature allows. No torch here, so the report
names rules without loading it.
"""
from __future__ import annotations

import math

from harness.core.errors import SpecbenchError, unknown

RULES = ("greedy", "lossless", "typical")
LOSSY_RULES = {"typical"}


def check_rule(rule: str, temperature: float) -> None:
    """One-line errors for impossible rule/temperature combinations."""
    if not math.isfinite(temperature) or temperature < 0:
        raise SpecbenchError(f"--temperature must be >= 0 and finite, got {temperature}")
    if rule not in RULES:
        raise unknown("acceptance rule", rule, RULES)
    if temperature == 0 and rule != "greedy":
        raise SpecbenchError(f"--acceptance {rule} needs --temperature > 0; at T = 0 only greedy applies")
    if temperature > 0 and rule == "greedy":
        raise SpecbenchError("--acceptance greedy is for --temperature 0; use lossless (default) or typical")


def default_rule(temperature: float) -> str:
    return "greedy" if temperature == 0 else "lossless"
