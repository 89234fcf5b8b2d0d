"""The official implementations specbench runs beside its own (peers), as data: where each lives
under the peer root, which transformers its environment pins, which worker adapter drives it, the
settings its own runner uses, and the specbench method + config that decodes the same algorithm
with the same settings (the row it is compared with). Read without torch (reports use the labels).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import SpecbenchError, did_you_mean


@dataclass(frozen=True)
class Peer:
    name: str                 # "spec-bench/eagle2": <source>/<method>
    method: str               # the specbench method it mirrors
    label: str                # its rows' name in every table and plot
    folder: str               # under the peer root (../shared/peers)
    transformers: str         # the version its environment pins (scripts/setup_peers.sh)
    adapter: str              # harness/peers/worker.py ADAPTERS key
    ar_adapter: str           # the peer's own plain decoding, its speedups' baseline
    settings: dict[str, Any] = field(default_factory=dict)  # the peer's knobs, as its runner sets them
    ours: dict[str, Any] = field(default_factory=dict)      # our method config with the same settings
    layout: str | None = None  # official weight layout to export our drafter in (None: training-free)

    @property
    def source(self) -> str:
        return self.name.split("/")[0]


SPEC_BENCH = "spec-bench"
SPEC_BENCH_LATEST = "spec-bench-latest-transformer"

PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("spec-bench/eagle2", "eagle2", "EAGLE-2 (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/eagle2",
         "spec-bench/ar", settings={"total_token": 60, "depth": 5, "top_k": 10},
         ours={"total_tokens": 60, "depth": 5, "top_k": 10}, layout="eagle"),
    Peer("spec-bench/pld", "pld", "Prompt lookup (Spec-Bench)", SPEC_BENCH, "4.37.1", "spec-bench/pld",
         "spec-bench/ar", settings={"draft_matching_window_size": 3, "draft_num_candidate_tokens": 10},
         ours={"max_ngram": 3, "min_ngram": 1, "max_draft": 10, "adaptive": False, "match": "first"}),
]}


def get_peer(name: str) -> Peer:
    if name not in PEERS:
        raise SpecbenchError(f"unknown peer '{name}'{did_you_mean(name, PEERS)}; peers: {', '.join(PEERS)}")
    return PEERS[name]


def implementation(peer: Peer, commit: str | None) -> str:
    """What a peer's records name as their implementation: its folder and the commit it is at."""
    return f"{peer.folder}@{commit}" if commit else peer.folder
