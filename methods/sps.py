"""SpS: standard speculative sampling with a small draft model of the target's family (Leviathan
et al. 2023; Chen et al. 2023). Training-free: the draft is any causal LM with the target's
tokenizer, loaded like a target (`--set sps.draft=<alias|dir|file.gguf>`).

Each step the draft extends the context by a chain of up to `gamma` tokens, one draft forward per
token, ending early after a draft it is less than `confidence` sure of (as HF's assistant does):
greedy at T = 0, sampled from its processed distribution q at T > 0 (q goes into the tree, so the
shared verifier applies the lossless min(1, p/q) rule with the max(0, p - q) residual). The draft's
own KV cache always holds a prefix of the committed context: before proposing, rows past the
longest common prefix with the context are dropped and the missing tokens fed in one forward.

`schedule` "heuristic" is HF assisted generation's rule (gamma + 2 after a fully accepted chain,
gamma - 1 otherwise, never below 1), so the comparison with `bench --assisted` is like for like.
"""
from __future__ import annotations

from typing import Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.target import Target
from harness.core.tree import DraftTree
from harness.core.verify import processed_probs, sample
from methods.common.base import Drafter
from methods.common.config_types import integer, kinds, number, one_of


class SpeculativeSampling(Drafter):
    """A chain of `gamma` tokens from a small draft LM with its own KV cache."""

    name = "sps"
    display_name = "SpS"
    paper = "Leviathan et al., ICML 2023; Chen et al., 2023"
    year = 2023
    color = "#000000"
    order = 20
    checkpoint_layout = "any causal LM with the target tokenizer (--set sps.draft=...)"
    defaults: dict[str, Any] = {
        "draft": None,             # alias (e.g. qwen2.5-coder-0.5b), HF directory or .gguf file
        "gamma": 8,                # most draft tokens per step (the initial value under "heuristic")
        "schedule": "constant",    # "constant" | "heuristic" (HF assisted generation's)
        "max_gamma": 16,           # cap for the heuristic schedule
        "confidence": 0.4,         # end the chain after a draft the draft model gives less than this
                                   # probability (HF's assistant_confidence_threshold default); 0 = off
    }
    config_types = {"draft": kinds("str", "null"), "gamma": integer(1), "schedule": one_of("constant", "heuristic"),
                    "max_gamma": integer(1), "confidence": number(0, 1)}

    def __init__(self, target, config: dict[str, Any] | None = None, draft: Target | None = None) -> None:
        super().__init__(target, config)
        if self.config["schedule"] not in ("constant", "heuristic"):
            raise SpecbenchError(f"sps schedule must be 'constant' or 'heuristic', got {self.config['schedule']!r}")
        if int(self.config["gamma"]) < 1:
            raise SpecbenchError(f"sps gamma must be >= 1, got {self.config['gamma']}")
        self.draft = draft if draft is not None else self.load_draft(target, self.config["draft"])
        check_same_vocab(target, self.draft)
        self._cache = None
        self._cached: list[int] = []   # the tokens whose KV rows the draft cache holds, in order
        self._gamma = int(self.config["gamma"])
        self._proposed = 0

    @staticmethod
    def load_draft(target: Target, spec: str | None) -> Target:
        if not spec:
            raise SpecbenchError("sps needs a draft model: --set sps.draft=<alias|HF dir|file.gguf> "
                                 "(e.g. qwen2.5-coder-0.5b for the qwen2.5-coder-1.5b target)")
        dtype = str(target.dtype).replace("torch.", "")
        return Target.load(str(spec), device=str(target.device), dtype=dtype)

    def enable_compile(self, mode: str | None = None) -> None:
        self.draft.enable_compile(mode)  # the draft model's steps, as the target's

    def runtimes(self) -> list:
        return [self.draft.runtime] if self.draft.runtime is not None else []

    def begin(self, prompt: torch.Tensor, prefill, root: int) -> None:
        self._cache = self.draft.new_cache(capacity=prompt.numel() + 1024)
        self._cached = []
        self._gamma = int(self.config["gamma"])
        self._feed(prompt.tolist(), logits="none")

    def _feed(self, tokens: list[int], logits: str = "last") -> torch.Tensor | None:
        """Append `tokens` to the draft cache; the draft's logits [V] after the last one (if asked)."""
        out = self.draft.forward(torch.tensor(tokens), self._cache, logits=logits)
        self._cached += tokens
        return None if out.logits is None else out.logits[-1]

    def _sync(self, context: list[int]) -> list[int]:
        """Drop cached rows past the longest common prefix with `context`; the tokens still to feed."""
        n = min(len(self._cached), len(context) - 1)  # the root (context[-1]) is always fed
        common = 0
        while common < n and self._cached[common] == context[common]:
            common += 1
        if common < len(self._cached):
            self._cache.crop_to(common)
            del self._cached[common:]
        return context[common:]

    @torch.inference_mode()
    def propose(self, ctx) -> DraftTree:
        k = min(self._gamma, ctx.max_nodes - 1)
        if k < 1:
            return DraftTree.root_only(ctx.root)
        sampling = ctx.sampling
        logits = self._feed(self._sync(ctx.tokens))
        drafts, q_rows = [], []
        floor = float(self.config["confidence"])
        for i in range(k):
            if sampling.temperature == 0:
                token = int(logits.max(-1).indices)
                confidence = float(logits.float().softmax(-1)[token]) if floor > 0 else 1.0
            else:
                q = processed_probs(logits, sampling.temperature, sampling.top_p)
                token = sample(q, ctx.generator)
                q_rows.append(q)
                confidence = float(q[token])
            drafts.append(token)
            # The chain's length depends on the drafts alone, so stopping early keeps sampling lossless.
            if i + 1 == k or confidence < floor:
                break  # the last draft is never fed: nothing would read its logits
            logits = self._feed([token])
        tree = DraftTree.chain(ctx.root, drafts)
        if q_rows:  # q[i]: the law node i's child was drawn from; the leaf has no child
            tree.q = torch.stack(q_rows + [torch.zeros_like(q_rows[0])])
        self._proposed = len(drafts)
        return tree

    def observe(self, step) -> None:
        # The cache is re-synced against the context at the next proposal; only the schedule moves here.
        if self.config["schedule"] == "heuristic" and self._proposed:
            if step.accepted == self._proposed:
                self._gamma = min(self._gamma + 2, int(self.config["max_gamma"]))
            else:
                self._gamma = max(1, self._gamma - 1)


def check_same_vocab(target: Target, draft: Target) -> None:
    """A draft must speak the target's tokenizer: same vocabulary hash and LM-head size."""
    if draft.vocab_hash() != target.vocab_hash():
        raise SpecbenchError(f"draft '{draft.name}' has another tokenizer than target '{target.name}' "
                             f"(vocab hash {draft.vocab_hash()} vs {target.vocab_hash()}); "
                             "pick a draft of the target's family")
    if draft.vocab_size != target.vocab_size:
        raise SpecbenchError(f"draft '{draft.name}' has {draft.vocab_size} logits per token, target '{target.name}' "
                             f"{target.vocab_size}; pick a draft of the target's family")
