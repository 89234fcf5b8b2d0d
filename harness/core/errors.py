"""User-facing errors: one clear line that names the fix, never a traceback."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class SpecbenchError(Exception):
    """An error a user can cause (bad option, missing file, wrong model). The CLI prints it as one line."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown(kind: str, name: str, choices: Iterable[str]) -> SpecbenchError:
    """Error for an unknown name of some kind (method, benchmark, target...) with a suggestion."""
    choices = sorted(choices)
    return SpecbenchError(
        f"unknown {kind} '{name}'{did_you_mean(name, choices)}; choose from: {', '.join(choices)}"
    )
