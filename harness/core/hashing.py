"""Stable hashes of JSON-like configs: method configs (checkpoint names, record keys) and run
configs (run folders) hash alike in every layer."""
from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and compact separators: equal configs give equal strings.

    Tuples serialise as lists and floats as `json` writes them (shortest repr), so a config read
    back from meta.json hashes like the one that was written. Other objects (Path, enums) fall back
    to `str` so that a config holding a path still hashes instead of crashing the run.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(obj: Any) -> str:
    """First 12 hex digits of sha256 over `canonical_json(obj)`; independent of key order."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:12]
