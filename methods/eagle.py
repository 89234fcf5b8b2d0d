"""EAGLE: an autoregressive draft head on the target's features, with EAGLE-1's static tree.

Draft model (as released): x_i = fc([emb(t_{i+1}) ; f_i]) (2H -> H, bias), then `layers` decoder
layers of the target's own architecture (the first without its input norm, no final norm); the
output h_{i+1} is trained to equal f_{i+1}, and its tokens come from the target's frozen LM head.
f is the target's last hidden state after the final norm. The draft keeps its own KV cache of
committed context only: each cycle it consumes the accepted tokens with their target features
(`observe`); the rows it writes while expanding a tree are dropped after `propose`.

`EagleCore` holds that machinery; EAGLE-1 (`eagle`), EAGLE-2 (`eagle2`, same weights) and Gumiho
differ only in how they grow the tree.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from harness.draft_layers import DecoderStack
from harness.train.losses import frozen_head_ce, masked_smooth_l1
from harness.tree import DraftTree, StaticTree
from methods.base import LearnedDrafter

# EAGLE-1's own "mc_sim_7b_63" (SafeAILab/EAGLE, eagle/model/choices.py): 25 nodes, depth 5.
EAGLE1_TREE = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0],
               [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0],
               [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


class EagleCore(LearnedDrafter):
    """fc + decoder layers on (token, feature) pairs, with a draft KV cache of committed context."""

    defaults: dict[str, Any] = {"layers": 1, "fc_bias": True, "layer_config": None}
    arch_keys = ("layers", "fc_bias", "layer_config")
    first_input_norm = False

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        h = target.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=self.config["fc_bias"])
        self.stack = DecoderStack(target.config, self.config["layers"], first_input_norm=self.first_input_norm,
                                  final_norm=False, overrides=self.config["layer_config"])
        self.to(device=target.device)
        self._cache = None
        self._last: torch.Tensor | None = None   # draft output at the last committed position

    @property
    def _dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """fc([emb(token) ; feature]); embedding first, as the released weights expect."""
        return self.fc(torch.cat([self.target.embed(tokens).to(feats.dtype), feats], dim=-1))

    def draft_forward(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run [n] pairs on top of the draft cache; returns [n, H] outputs (rows stay in the cache)."""
        x = self.fuse(tokens, feats.to(self._dtype))[None]
        m = None if mask is None else mask[None, None]
        return self.stack(x, positions[None], self._cache, m)[0]

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.project(hidden.to(self.target.dtype)).float().log_softmax(-1)

    # ---- decoding state -------------------------------------------------------------------
    @torch.inference_mode()
    def begin(self, prompt, prefill, root: int) -> None:
        n = prompt.numel()
        self._cache = self.stack.new_cache(capacity=n + 1024)
        # Pair (f_i, t_{i+1}): the token is advanced by one; the last pair takes the root.
        nxt = torch.cat([prompt[1:], torch.tensor([root])]).to(self.target.device)
        out = self.draft_forward(nxt, prefill.hidden, torch.arange(n, device=self.target.device))
        self._last = out[-1]

    @torch.inference_mode()
    def observe(self, step) -> None:
        # Accepted nodes' features pair with the next accepted token; the last with the bonus.
        toks = torch.cat([step.tokens[1:], torch.tensor([step.bonus])]).to(self.target.device)
        start = self._cache.length
        out = self.draft_forward(toks, step.hidden, torch.arange(start, start + toks.numel(), device=toks.device))
        self._last = out[-1]

    def tree_mask(self, committed: int, ancestors: list[list[int]], n_tree_rows: int) -> torch.Tensor:
        """Boolean [q, committed + n_tree_rows + q]: all committed rows, the listed ancestor rows
        (indices into the tree rows already cached), and itself."""
        q = len(ancestors)
        m = torch.zeros(q, committed + n_tree_rows + q, dtype=torch.bool, device=self.target.device)
        m[:, :committed] = True
        for i, anc in enumerate(ancestors):
            for r in anc:
                m[i, committed + r] = True
            m[i, committed + n_tree_rows + i] = True
        return m

    # ---- training -------------------------------------------------------------------------
    def serial_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """SmoothL1(h_{i+1}, f_{i+1}) + 0.1 soft-CE against the target's distribution, on pairs
        (f_i noised, t_{i+1}) where t_{i+1} is an answer token. Returns (h, terms); h[:, i] ~ f_{i+1}."""
        f_in = batch.features[:, :-1]
        toks = batch.input_ids[:, 1:]
        target = batch.target_features[:, 1:]
        mask = (batch.loss_mask * batch.attention_mask)[:, 1:]
        b, t, _ = f_in.shape
        pos = torch.arange(t, device=f_in.device)[None].expand(b, t)
        h = self.stack(self.fuse(toks, f_in), pos)
        v = masked_smooth_l1(h, target, mask)
        p, acc = frozen_head_ce(h, self.target.lm_head.weight, mask, target_hidden=target)
        return h, {"loss": v + 0.1 * p, "vloss": v.detach(), "ploss": p.detach(), "acc": acc.detach()}

    def loss(self, batch) -> dict[str, torch.Tensor]:
        return self.serial_loss(batch)[1]

    # ---- official checkpoints ------------------------------------------------------------
    @classmethod
    def map_official(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Released EAGLE keys -> ours: fc.* as is, layers.N.* -> stack.layers.N.*; the copied
        embedding is dropped (we reuse the target's); rotary buffers are ignored."""
        out = {}
        for k, v in state.items():
            if k.startswith("embed_tokens.") or "rotary_emb" in k:
                continue
            out[("stack." + k) if k.startswith("layers.") else k] = v
        return out

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "EagleCore":
        import json

        state = _read_state(folder)
        cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
        if cfg.get("hidden_size", target.hidden_size) != target.hidden_size:
            from harness.errors import SpecbenchError

            raise SpecbenchError(f"{folder} is for hidden size {cfg.get('hidden_size')}, target has {target.hidden_size}")
        mapped = cls.map_official(state)
        layers = 1 + max(int(k.split(".")[2]) for k in mapped if k.startswith("stack.layers."))
        arch = {"layers": layers, "fc_bias": "fc.bias" in mapped, "layer_config": draft_layer_config(cfg, target)}
        drafter = cls(target, {**arch, **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter


LAYER_FIELDS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                "hidden_act")


def draft_layer_config(draft_cfg: dict, target) -> dict | None:
    """Fields of a released draft's config.json that differ from the target's (None when none do)."""
    tc = target.config
    out = {}
    for key in LAYER_FIELDS:
        if key not in draft_cfg:
            continue
        have = (tc.rope_parameters or {}).get("rope_theta") if key == "rope_theta" and hasattr(tc, "rope_parameters") \
            else getattr(tc, key, None)
        if draft_cfg[key] != have:
            out[key] = draft_cfg[key]
    return out or None


def _read_state(folder) -> dict[str, torch.Tensor]:
    from pathlib import Path

    folder = Path(folder)
    st = sorted(folder.glob("*.safetensors"))
    if st:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in st:
            state.update(load_file(str(f)))
        return state
    bins = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    if not bins:
        from harness.errors import SpecbenchError

        raise SpecbenchError(f"{folder} holds no weights (*.safetensors, pytorch_model.bin)")
    state = {}
    for f in bins:
        state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


class Eagle(EagleCore):
    """EAGLE-1: the draft head with a static tree (top-k children per node, official 25 nodes)."""

    name = "eagle"
    defaults = {**EagleCore.defaults, "tree": EAGLE1_TREE}

    @torch.inference_mode()
    def propose(self, ctx) -> DraftTree:
        tree = StaticTree.named(self.config["tree"])
        depth = min(tree.max_depth, ctx.max_nodes - 1)
        if depth < 1:
            return DraftTree.root_only(ctx.root)
        committed = self._cache.length
        sampled = ctx.sampling.temperature > 0
        dev = self.target.device
        tokens, parents, q_rows = [ctx.root], [-1], {}
        index = {0: 0}                      # static node id (0 = root) -> our node index
        ancestors = {0: []}                 # our node index -> its cached tree rows
        row_of: dict[int, int] = {}         # our node index -> its row among cached tree rows
        hidden_of = {0: self._last}         # node -> draft output predicting its children
        children: dict[int, list[int]] = {}
        for i, p in enumerate(tree.parents):
            if tree.depths[i] <= depth:
                children.setdefault(p, []).append(i + 1)
        frontier, n_rows = [0], 0
        for d in range(depth):
            expand = [n for n in frontier if n in children]
            if not expand:
                break
            if d > 0:  # feed the expanding nodes (depth d) to get their outputs
                ours = [index[n] for n in expand]
                toks = torch.tensor([tokens[o] for o in ours], device=dev)
                feats = torch.stack([hidden_of[parents[o]] for o in ours])
                mask = self.tree_mask(committed, [ancestors[o] for o in ours], n_rows)
                pos = torch.full((len(ours),), committed + d - 1, device=dev)
                out = self.draft_forward(toks, feats, pos, mask)
                for j, o in enumerate(ours):
                    hidden_of[o] = out[j]
                    row_of[o] = n_rows + j
                n_rows += len(ours)
            nxt = []
            # One LM-head projection for every node expanded at this depth.
            logps = self.logp(torch.stack([hidden_of[index[n]] for n in expand]))
            for row, n in enumerate(expand):
                o = index[n]
                logp = logps[row]
                kids = children[n]
                k = max(tree.ranks[c - 1] for c in kids) + 1
                if sampled:
                    # Children drawn without replacement from the draft distribution q; the
                    # verifier needs q (lossless multi-draft rejection sampling).
                    from harness.verify import processed_probs

                    q = processed_probs(logp, ctx.sampling.temperature, ctx.sampling.top_p)
                    top = torch.multinomial(q, min(k, int((q > 0).sum())), replacement=False,
                                            generator=ctx.generator).tolist()
                    q_rows[o] = q
                else:
                    top = logp.topk(k).indices.tolist()
                for c in kids:
                    r = tree.ranks[c - 1]
                    if r >= len(top):
                        continue
                    index[c] = len(tokens)
                    tokens.append(top[r])
                    parents.append(o)
                    anc = ancestors[o] + ([row_of[o]] if o in row_of else [])
                    ancestors[index[c]] = anc
                    nxt.append(c)
            frontier = nxt
        self._cache.crop_to(committed)
        q = None
        if sampled:
            q = torch.zeros(len(tokens), self.target.vocab_size)
            for o, dist in q_rows.items():
                q[o] = dist
        return DraftTree(torch.tensor(tokens), torch.tensor(parents), q=q)
