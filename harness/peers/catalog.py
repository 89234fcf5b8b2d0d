"""The official implementations specbench runs beside its own (peers), as data: where each lives
under the peer root, which transformers its environment pins, which worker adapter drives it, the
settings its own runner uses, the shims the worker applies to it, and the specbench method +
config that decodes the same algorithm with the same settings (the row it is compared with).
Read without torch (reports use the labels).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import SpecbenchError, did_you_mean

# What each worker shim does to a peer (harness/peers/worker.py SHIMS), recorded with every peer run.
SHIM_NOTES: dict[str, str] = {
    "rope_theta": "the peer's Llama attention builds its rotary embedding with base 10,000 whatever the config's "
                  "rope_theta says; the shim rebuilds it with rope_theta after the peer's `_init_rope`",
    "kv_heads": "the peer allocates its KV cache with one slot per query head while its attention writes one per "
                "key/value head, so on a grouped-query target the first write fails; the shim sizes the cache by "
                "key/value heads",
    "cuda_device": "the peer builds tensors on torch.device('cuda:0'); the shim gives the peer module a torch whose "
                   "device() is the CPU",
    "gumiho_fp32": "the peer casts its MLP heads to float16 and torch.compiles them (cnets.py:597-608) and casts "
                   "their outputs with .half() before the LM head (cnets.py:815,862); the shim skips compile_mlp "
                   "and makes .half() keep the run's dtype, so the draft runs in float32 as the base model does",
}


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
    # worker shims (SHIM_NOTES) -> the peer modules each applies to
    shims: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return self.name.split("/")[0]


SPEC_BENCH = "spec-bench"
SPEC_BENCH_LATEST = "spec-bench-latest-transformer"
EAGLE_TREE = {"total_token": 60, "depth": 5, "top_k": 10}     # Spec-Bench's and EAGLE's evaluation scripts
OURS_EAGLE_TREE = {"total_tokens": 60, "depth": 5, "top_k": 10}
MEDUSA_TREE = {"tree": "mc_sim_7b_63"}                          # the runners' default choices
# Gumiho's evaluation scripts (scripts/eval_*.sh; our preset=paper): FTA is --complete_mask.
GUMIHO = {"top_k": 14, "depth": 6, "total_tokens": 64, "mlp_num": 5, "serial_head_num": 2, "mlptopk": 35,
          "pruning": 35}


def _rope(*modules: str) -> dict[str, tuple[str, ...]]:
    return {"rope_theta": modules}


PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("spec-bench/eagle", "eagle", "EAGLE (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/eagle",
         "spec-bench/ar", settings={"tree_choices": "mc_sim_7b_63", "top_k": 10}, ours={}, layout="eagle",
         shims=_rope("model.eagle.modeling_llama_kv", "model.eagle.cnets")),
    Peer("spec-bench/eagle2", "eagle2", "EAGLE-2 (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/eagle2",
         "spec-bench/ar", settings=EAGLE_TREE, ours=OURS_EAGLE_TREE, layout="eagle"),
    Peer("spec-bench/eagle3", "eagle3", "EAGLE-3 (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/eagle3",
         "spec-bench/ar", settings=EAGLE_TREE, ours=OURS_EAGLE_TREE, layout="eagle3"),
    Peer("spec-bench/medusa", "medusa", "Medusa (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/medusa",
         "spec-bench/ar", settings={"medusa_num_heads": 4, "medusa_choices": "mc_sim_7b_63"}, ours=MEDUSA_TREE,
         layout="medusa", shims={**_rope("model.medusa.modeling_llama_kv"), "kv_heads": ("model.medusa.kv_cache",)}),
    Peer("spec-bench/hydra", "hydra", "Hydra (Spec-Bench)", SPEC_BENCH_LATEST, "4.50.1", "spec-bench/hydra",
         "spec-bench/ar", settings={"hydra_choices": "mc_sim_7b_63"}, ours=MEDUSA_TREE, layout="hydra",
         shims={**_rope("model.hydra.modeling_llama_kv"), "kv_heads": ("model.hydra.kv_cache",)}),
    Peer("spec-bench/pld", "pld", "Prompt lookup (Spec-Bench)", SPEC_BENCH, "4.37.1", "spec-bench/pld",
         "spec-bench/ar", settings={"draft_matching_window_size": 3, "draft_num_candidate_tokens": 10},
         ours={"max_ngram": 3, "min_ngram": 1, "max_draft": 10, "adaptive": False, "match": "first"}),
    # The training-free peers (Spec-Bench's runners' defaults). Token Recycling's runner keeps one
    # adjacency matrix for the benchmark: here each answer starts from a zero one, on both sides.
    Peer("spec-bench/lookahead", "lookahead", "Lookahead (Spec-Bench)", SPEC_BENCH, "4.37.1", "spec-bench/lookahead",
         "spec-bench/ar", settings={"level": 3, "window": 10, "guess": 10},
         ours={"level": 3, "window": 10, "guess": 10, "full_ngram": False}),
    Peer("spec-bench/recycling", "recycling", "Token Recycling (Spec-Bench)", SPEC_BENCH, "4.37.1",
         "spec-bench/recycling", "spec-bench/ar",
         settings={"tree_version": "2.2.2", "output_id_topk": 8, "adjacency": "per answer"},
         ours={"tree": "2.2.2", "topk": 8, "update": "tree", "keep_across_answers": False},
         shims={"cuda_device": ("evaluation.inference_recycling",)}),
    Peer("spec-bench/samd", "samd", "SAM-Decoding (Spec-Bench)", SPEC_BENCH, "4.37.1", "spec-bench/samd",
         "spec-bench/ar", settings={"samd_n_predicts": 40, "samd_len_threshold": 5, "samd_len_bias": 5,
                                    "tree_method": None, "static_sam_path": None, "attn_implementation": "sdpa"},
         ours={"aux": "none", "corpus": "none", "n_predicts": 40, "len_threshold": 5, "len_bias": 5, "alpha": 4.0}),
    # REST runs over PyPI's draftretriever 0.1.1 (the vendored 0.1.0 needs crates.io to build), whose
    # search is not the vendored one's: docs/peers.md, "Training-free peers".
    Peer("spec-bench/rest", "rest", "REST (Spec-Bench)", SPEC_BENCH, "4.37.1", "spec-bench/rest", "spec-bench/ar",
         settings={"datastore": "default", "num_draft": 64, "max_token_span": 16},
         ours={"datastore": "default", "num_draft": 64, "max_span": 16, "min_span": 2},
         shims={"kv_heads": ("model.rest.rest.model.kv_cache",)}),
    Peer("eagle/eagle2", "eagle2", "EAGLE-2 (EAGLE)", "eagle", "4.53.3", "eagle/eagle", "eagle/ar",
         settings={**EAGLE_TREE, "use_eagle3": False}, ours=OURS_EAGLE_TREE, layout="eagle"),
    Peer("eagle/eagle3", "eagle3", "EAGLE-3 (EAGLE)", "eagle", "4.53.3", "eagle/eagle", "eagle/ar",
         settings={**EAGLE_TREE, "use_eagle3": True}, ours=OURS_EAGLE_TREE, layout="eagle3"),
    Peer("medusa/medusa", "medusa", "Medusa (FasterDecoding)", "medusa", "4.37.1", "medusa/medusa", "hf/ar",
         settings={"medusa_choices": "mc_sim_7b_63"}, ours=MEDUSA_TREE, layout="medusa"),
    Peer("hydra/hydra", "hydra", "Hydra (Hydra)", "hydra", "4.36.2", "hydra/hydra", "hf/ar",
         settings={"hydra_choices": "mc_sim_7b_63"}, ours=MEDUSA_TREE, layout="hydra",
         shims={**_rope("hydra.model.modeling_llama_kv"), "kv_heads": ("hydra.model.kv_cache",)}),
    Peer("gumiho/gumiho", "gumiho", "Gumiho (Gumiho)", "gumiho", "4.36.2", "gumiho/gumiho", "gumiho/ar",
         settings={**GUMIHO, "complete_mask": 1}, ours={"preset": "paper"}, layout="gumiho",
         shims={"gumiho_fp32": ("gumiho.model.cnets",)}),
    Peer("gumiho/gumiho-nofta", "gumiho", "Gumiho without FTA (Gumiho)", "gumiho", "4.36.2", "gumiho/gumiho",
         "gumiho/ar", settings={**GUMIHO, "complete_mask": 0}, ours={"preset": "paper", "fta": "off"},
         layout="gumiho", shims={"gumiho_fp32": ("gumiho.model.cnets",)}),
]}

# Spec-Bench's SpS needs a draft model with the target's tokenizer: SmolLM2-135M is the smallest of
# its family, so there is none to run it with (and no peer entry).


def get_peer(name: str) -> Peer:
    if name not in PEERS:
        raise SpecbenchError(f"unknown peer '{name}'{did_you_mean(name, PEERS)}; peers: {', '.join(PEERS)}")
    return PEERS[name]


def implementation(peer: Peer, commit: str | None) -> str:
    """What a peer's records name as their implementation: its folder and the commit it is at."""
    return f"{peer.folder}@{commit}" if commit else peer.folder
