"""Fit a static-tree drafter's tree to its heads on held-out distilled answers, and store it in
the checkpoint's `config.json` (`decode.tree`, read back by `from_pretrained`; `--set tree=...`
still overrides it). The search itself is `harness/tree_search.py`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.core.errors import SpecbenchError
from harness.core.tree import TREE_PRESETS, StaticTree


def is_static_tree_drafter(drafter) -> bool:
    """Whether a drafter (class or instance) drafts a static rank tree from teacher-forceable heads."""
    return hasattr(drafter, "teacher_forced_heads") and hasattr(drafter, "own_proj")


# Fitted candidates kept for tree "auto": the verify cost curve is measured up to 64 tokens.
CANDIDATES = 63


def calibrate_tree(drafter, held_out: list, nodes: int, topk: int = 10) -> dict[str, Any]:
    """The best `nodes`-node static tree for `drafter` on the greedy answers among `held_out`,
    with the τ it and the built-in presets are expected to reach there, and the `CANDIDATES` most
    frequent nodes with their acceptance frequency (what tree "auto" sizes from)."""
    from harness.train.tree_search import expected_tau, greedy_sequences, rank_table, ranked_candidates

    if not is_static_tree_drafter(drafter):
        raise SpecbenchError(f"method '{drafter.name}' does not draft a static tree: calibrate-tree is for medusa and hydra")
    seqs = greedy_sequences(drafter.target, held_out)
    if not seqs:
        raise SpecbenchError("no greedy answers in the held-out split: distill with --samples >= 1 (sample 0 is greedy)")
    ranks = rank_table(drafter, seqs)
    candidates = ranked_candidates(ranks, max(nodes, CANDIDATES), topk)
    tree = [path for path, _ in candidates[:nodes]]
    heads = drafter.config["heads"]
    presets = {name: round(expected_tau(ranks, StaticTree.for_heads(name, heads).choices), 4) for name in TREE_PRESETS}
    return {"tree": tree, "nodes": len(tree), "topk": topk, "conversations": len(seqs),
            "positions": int(len(ranks)), "expected_tau": round(expected_tau(ranks, tree), 4),
            "expected_tau_current": round(expected_tau(ranks, drafter.tree.choices), 4),
            "expected_tau_presets": presets, "candidates": candidates}


def save_tree(folder: Path, result: dict[str, Any], fixed: bool = False) -> None:
    """Record the calibration as the checkpoint's decoding default, with how it was found: tree
    "auto" and the fitted candidates (sized per machine at run time), or with `fixed` the
    `nodes`-node tree itself."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise SpecbenchError(f"{folder} has no config.json: calibrate a specbench checkpoint (train one first)")
    meta = json.loads(path.read_text())
    decode = meta.setdefault("decode", {})
    decode["tree"] = result["tree"] if fixed else "auto"
    decode["tree_candidates"] = result["candidates"]
    meta["tree_calibration"] = {k: v for k, v in result.items() if k not in ("tree", "candidates")}
    path.write_text(json.dumps(meta, indent=2) + "\n")
