"""Gumiho (ICML 2025): a serial Transformer drafts the first two tokens, parallel MLP heads the rest.

Serial part: EAGLE's fc + `serial_layers` decoder layers (default 2; the first without input
norm, no final norm). MLP heads (default 5): each SiLU(Linear 2H->H) without residual, then five
x + SiLU(Linear H->H) blocks, all zero-initialised, read through the target's frozen LM head.
Their input is [u1 ; u2], the fc-fused inputs of the last two serial levels; all heads run in
one batched call on the depth-2 rows and predict depths 3 .. 2 + mlp_heads.

Three switches cover where the official code differs from a lossless, bug-free reading (each an
inference key; `preset=paper` selects the official behaviour and tree settings):
  fta                  off | paper | exact (default). "Full tree attention": paper pads each short
                       path with the most frequent node of each deeper level and verifies the
                       borrowed nodes as if they followed its leaf (their logits come from another
                       context: not lossless, and the harness shows it as mismatches); exact makes the
                       borrowed tokens real nodes under the short path's leaf, dropping the
                       lowest-scored nodes to stay within the token budget and refilling the
                       slots that frees with the next-best candidates (`fta_exact`).
  mlp_row_alignment    parent (default): slot 1 of MLP row r is the true parent of depth-2 beam r;
                       paper: the r-th depth-1 token in score order (usually another path).
  serial_sibling_mask  eagle2 (default): each depth-1 beam sees only its ancestors; paper: none
                       (beam j also sees beams 0..j-1 causally).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.core.errors import SpecbenchError
from harness.core.packed_linear import apply_linear
from harness.core.tree import DraftTree
from harness.core.tree_build import CandidatePool, Node, build_tree
from methods.common.losses import masked_smooth_l1
from methods.common.checkpoint_io import read_config, read_state
from methods.common.eagle_core import EagleCore, draft_layer_config, official_draft_config
from methods.common.official_layout import KeyMap, OfficialFiles, exported
from methods.common.blocks import ResBlock
from methods.common.config_types import integer

if TYPE_CHECKING:
    from harness.core.decode import DraftContext

PAPER_PRESET = {"top_k": 14, "depth": 6, "mlp_topk": 35, "pruning": 35, "total_tokens": 64, "fta": "paper",
                "mlp_row_alignment": "paper", "serial_sibling_mask": "paper"}


class NoResBlock(nn.Module):
    def __init__(self, d_in: int, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, hidden)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(apply_linear(self.linear, x))


class Gumiho(EagleCore):
    """Gumiho: 2-layer serial draft for depths 1-2, parallel MLP heads for the rest, full tree attention."""

    name = "gumiho"
    display_name = "Gumiho"
    paper = "Li et al., ICML 2025"
    year = 2025
    color = "#CC79A7"
    order = 70
    checkpoint_layout = "AMD-AIG-AIMA/Gumiho: config.json + pytorch_model.bin (serial layers + MLP heads)"
    default_lr = 1e-3
    defaults: dict[str, Any] = {
        **EagleCore.defaults, "layers": 2,
        "mlp_heads": 5, "mlp_blocks": 5,
        "mlp_ce_from_epoch": 2,   # the official schedule switches the MLP CE on after 2 epochs
        # CPU defaults (official eval: 14 / 6 / 35 / 35 / 64); the tree budget is sized per step
        # from this machine's verify cost curve, as EAGLE-2's ("auto"; an integer fixes it).
        "top_k": 8, "depth": 6, "mlp_topk": 12, "pruning": 12, "total_tokens": "auto",
        "fta": "exact", "mlp_row_alignment": "parent", "serial_sibling_mask": "eagle2",
        "preset": "default",
    }
    arch_keys = EagleCore.arch_keys + ("mlp_heads", "mlp_blocks")
    config_types = {"mlp_heads": integer(1), "mlp_blocks": integer(0), "mlp_ce_from_epoch": integer(0),
                    "mlp_topk": integer(1), "pruning": integer(1)}

    @classmethod
    def candidates(cls, config: dict[str, Any]) -> int:
        """Two serial levels of `top_k`, then `mlp_heads` MLP levels of `pruning` each."""
        return 2 * config["top_k"] + config["mlp_heads"] * config["pruning"]

    @classmethod
    def resolve_config(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        cfg = super().resolve_config(overrides)
        if "depth" not in overrides:
            # One serial expansion, then the MLP levels (official: 5 heads, depth 6), so that an
            # `ablate --set mlp_heads=3,5,7` sweep changes the heads and not the serial depth.
            cfg["depth"] = cfg["mlp_heads"] + 1
        if cfg["preset"] == "paper":
            cfg.update({k: v for k, v in PAPER_PRESET.items() if k not in overrides})
        elif cfg["preset"] != "default":
            from harness.core.errors import unknown

            raise unknown("gumiho preset", cfg["preset"], ["default", "paper"])
        for key, allowed in (("fta", ("off", "paper", "exact")), ("mlp_row_alignment", ("paper", "parent")),
                             ("serial_sibling_mask", ("paper", "eagle2"))):
            if cfg[key] not in allowed:
                from harness.core.errors import unknown

                raise unknown(f"value for {key}", str(cfg[key]), allowed)
        if cfg["depth"] - cfg["mlp_heads"] < 1:
            raise SpecbenchError(f"gumiho needs depth > mlp_heads (one serial expansion at least); "
                                 f"got depth {cfg['depth']}, mlp_heads {cfg['mlp_heads']}")
        return cfg

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        h = target.hidden_size
        self.mlp = nn.ModuleList(
            nn.Sequential(NoResBlock(2 * h, h), *[ResBlock(h) for _ in range(self.config["mlp_blocks"])])
            for _ in range(self.config["mlp_heads"]))
        self.to(device=target.device)
        self.train_epoch = 0

    def run_mlp(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """[..., 2H] -> [..., heads, H]: the first `heads` heads (default all) on the same rows."""
        return torch.stack([head(x) for head in self.mlp[:heads]], dim=-2)

    # ---- training -------------------------------------------------------------------------
    def loss(self, batch) -> dict[str, torch.Tensor]:
        h, out = self.serial_loss(batch)                     # h[:, j] ~ f_{j+1}
        total = out.pop("loss")
        t = h.shape[1]
        # MLP inputs: g_j = fc([emb(t_{j+2}) ; h_j]) and the row at j is [g_j ; g_{j+1}];
        # head k at j is scored against f_{j+3+k} (the token 3+k ahead of t_j's successor pair).
        ids = batch.input_ids
        n = t - 1
        if n > 0:
            g = self.fuse(ids[:, 2 : 2 + n], h[:, :n])       # g_j for j < n
            heads_needed = self.config["mlp_heads"]
            rows = torch.cat([g[:, :-1], g[:, 1:]], dim=-1)  # [b, n-1, 2H] for j < n-1
            pred = self.run_mlp(rows)                        # [b, n-1, heads, H]
            full_mask = batch.loss_mask * batch.attention_mask
            ce_on = 0.1 if self.train_epoch >= self.config["mlp_ce_from_epoch"] else 0.0
            norm = 9.0  # the official mlp_loss_weight
            for k in range(heads_needed):
                off = 3 + k
                m = rows.shape[1] - max(0, off + rows.shape[1] - batch.features.shape[1])
                if m <= 0:
                    break
                tgt = batch.target_features[:, off : off + m]
                msk = full_mask[:, off : off + m]
                pk = pred[:, :m, k]
                vk = masked_smooth_l1(pk, tgt, msk)
                ck, ak = self.vocab.head_ce(pk, msk, target_hidden=tgt)
                w = 0.8 ** (k + 1)
                total = total + w * vk / norm + ce_on * w * ck / norm
                out[f"mlp{k}_acc"] = ak.detach()
        out["loss"] = total
        return out

    # ---- decoding -------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        cfg = self.config
        k = cfg["top_k"]
        dev = self.target.device
        committed = self._cache.length
        # 1. Root pass output -> depth-1 candidates (the first beam).
        d1_score, d1_tok = self.vocab.draft_topk(self._last, k)
        d1_score = d1_score.cpu()
        pool = CandidatePool()
        pool.add(d1_tok.tolist(), d1_score.tolist(), [-1] * k)
        # 2. One serial expansion over the k depth-1 beams at position `committed`.
        if cfg["serial_sibling_mask"] == "eagle2":
            mask = self.tree_mask(committed, [[] for _ in range(k)], 0)
        else:  # paper: no tree mask, so the siblings see each other causally
            mask = torch.ones(k, committed + k, dtype=torch.bool, device=dev)
            mask[:, committed:] = torch.ones(k, k, dtype=torch.bool, device=dev).tril()
        feats1 = self._last.expand(k, -1)
        out1 = self.draft_forward(d1_tok, feats1, torch.full((k,), committed, device=dev), mask)
        self._cache.crop_to(committed)
        child_score, child_tok = self.vocab.draft_topk(out1, k)
        cu = d1_score[:, None] + child_score.cpu()
        best = torch.topk(cu.flatten(), k).indices
        d2_parent = (best // k).tolist()                     # index into the depth-1 beam (= its candidate id)
        d2_tok = child_tok.flatten()[best.to(dev)]
        d2_ids = pool.add(d2_tok.tolist(), [float(cu.flatten()[b]) for b in best.tolist()], d2_parent)
        # 3. MLP levels: head j drafts level j + 3 (a sized tree runs only the heads of the
        # levels it may keep), all heads in one LM-head projection: [k, heads, mlp_topk].
        heads = max(0, self.auto_depth(2 + cfg["mlp_heads"]) - 2)
        if heads:
            u2 = self.fuse(d2_tok, out1[d2_parent])          # rows [u1 ; u2]
            slot1 = d2_parent if cfg["mlp_row_alignment"] == "parent" else list(range(k))
            u1 = self.fuse(d1_tok[slot1], feats1[slot1])
            mlp_score, mlp_tok = self.vocab.draft_topk(self.run_mlp(torch.cat([u1, u2], dim=-1), heads),
                                                       cfg["mlp_topk"])
        # 4. Per MLP level, beams extend by their row's head distribution; global pruning.
        beams = [(c, r, pool.scores[c]) for r, c in enumerate(d2_ids)]    # (cand id, row, score)
        for lvl in range(heads):
            if not beams:
                break
            rows = torch.tensor([r for _, r, _ in beams])
            tk_tok = mlp_tok[rows, lvl].tolist()
            scores = torch.tensor([s for _, _, s in beams])[:, None] + mlp_score[rows, lvl].cpu()
            pick = torch.topk(scores.flatten(), min(cfg["pruning"], scores.numel())).indices.tolist()
            picked = [divmod(p, cfg["mlp_topk"]) for p in pick]      # (beam, rank) pairs
            ids = pool.add([tk_tok[bi][ci] for bi, ci in picked], [float(scores[bi, ci]) for bi, ci in picked],
                           [beams[bi][0] for bi, _ in picked])
            beams = [(cid, beams[bi][1], pool.scores[cid]) for cid, (bi, _) in zip(ids, picked)]
        self.last_pool_size = len(pool)
        # 5. Rerank to the budget, then full tree attention.
        budget = ctx.within_budget(self.tree_budget(pool.scores))
        nodes = pool.select(budget, ctx.max_nodes)
        self.note_kept(nodes)
        if cfg["fta"] == "exact":  # from every candidate: what the padding frees is refilled
            nodes = fta_exact(pool.select(len(pool), ctx.max_nodes), budget)
        tree = build_tree(ctx.root, nodes)
        return fta_paper(tree) if cfg["fta"] == "paper" else tree

    # ---- official checkpoints ------------------------------------------------------------
    # The released file's keys (AMD-AIG-AIMA/Gumiho): EAGLE's, plus the MLP heads as `mlp.{i}.{j}.*`
    # (its loader renames them to its module's `mlp.mlp.`: gumiho/model/gumiho_model.py:74-80; a
    # state dict of that module is read too).
    official_keys = KeyMap(pairs=(("layers.", "stack.layers."), ("fc.", "fc."), ("mlp.", "mlp.")),
                           official_only=("embed_tokens.", "rotary_emb"), ours_only=("draft_ids",),
                           read_aliases=(("mlp.mlp.", "mlp."),))
    official_head = "gumiho/model/cnets.py:784"
    OFFICIAL_BLOCKS = 5  # ResBlocks per MLP head, fixed in the official module (gumiho/model/cnets.py:524-531)

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Gumiho":
        mapped = cls.official_keys.to_ours(read_state(folder, cls.name))
        layers = 1 + max(int(k.split(".")[2]) for k in mapped if k.startswith("stack.layers."))
        heads = 1 + max(int(k.split(".")[1]) for k in mapped if k.startswith("mlp."))
        blocks = max(int(k.split(".")[2]) for k in mapped if k.startswith("mlp."))
        arch = {"layers": layers, "mlp_heads": heads, "mlp_blocks": blocks, "draft_vocab": 0,
                "layer_config": draft_layer_config(read_config(folder, cls.name), target)}
        drafter = cls(target, {**arch, **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """The released layout: pytorch_model.bin, loaded strictly (gumiho_model.py:82), so with the
        target's embedding and fc's bias (always built: gumiho_model.py:59, cnets.py:542,585; ours
        without one is written as zeros); a config.json with the EConfig fields, which the official
        loader does not read (it picks a repository file by --model_name: gumiho_model.py:122-137)."""
        if self.config["mlp_blocks"] != self.OFFICIAL_BLOCKS:
            raise SpecbenchError(f"gumiho with mlp_blocks={self.config['mlp_blocks']} has no official layout: the "
                                 f"official heads have {self.OFFICIAL_BLOCKS} ResBlocks (gumiho/model/cnets.py:524-531)")
        weights = {"embed_tokens.weight": exported(self.target.embed_tokens.weight)}
        weights.update({k: exported(v) for k, v in self.official_keys.to_official(self.state_dict()).items()})
        weights.setdefault("fc.bias", torch.zeros(self.target.hidden_size))
        config = {**official_draft_config(self.target, self.config["layer_config"], self.config["layers"]),
                  "bias": True, "mlp_num": self.config["mlp_heads"]}
        heads = self.config["mlp_heads"]
        runner = (f"config.json: the official loader reads a repository file chosen by --model_name instead "
                  f"(gumiho/model/gumiho_model.py:122-137) and the head count from --mlp_num (default 5): pass this "
                  f"file to GumihoModel and --mlp_num {heads}")
        return OfficialFiles(weights, "pytorch_model.bin", config, self.official_departures() + [runner])


def _trunk(nodes: list[Node]) -> dict[int, int]:
    """Per depth, the node with the most leaf descendants (the official 'most frequent per column')."""
    children = Counter(n.parent for n in nodes)
    counts: Counter = Counter()
    for i in range(len(nodes)):
        if children[i] == 0:  # a leaf: count it on every ancestor
            j = i
            while j != -1:
                counts[j] += 1
                j = nodes[j].parent
    best: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.depth not in best or counts[i] > counts[best[n.depth]]:
            best[n.depth] = i
    return best


def fta_exact(candidates: list[Node], budget: int) -> list[Node]:
    """Lossless full tree attention over a pool's candidates (all of them, parents first: the
    `CandidatePool.select` of the whole pool). The real nodes start as the `budget` best; under
    every leaf shallower than the deepest, real copies of the trunk tokens of the deeper levels are
    chained (so their logits are computed in the right context); while that is over budget, the
    lowest-scored leaf is dropped. The slots this frees (a dropped leaf takes its chain with it) are
    then refilled with the next-best candidates whose parent is in the tree: one under a padded leaf
    takes that leaf's chain over (a real draft in place of a borrowed copy, at no slot's cost), any
    other gets as much chain as still fits. So the tree verifies `budget` nodes whenever the pool
    has that many, as the tree without FTA does."""
    kids: dict[int, list[int]] = {}
    for i, n in enumerate(candidates):
        kids.setdefault(n.parent, []).append(i)
    order = sorted(range(len(candidates)), key=lambda i: -candidates[i].score)  # stable: as `rerank`
    real = set(order[:budget])

    def leaf(i: int) -> bool:
        return not any(c in real for c in kids.get(i, ()))

    while True:  # pad every short leaf to the deepest level; over budget, drop the worst leaf
        depth = max((candidates[i].depth for i in real), default=0)
        chains = {i: depth - candidates[i].depth for i in sorted(real) if leaf(i)}
        free = budget - len(real) - sum(chains.values())
        if free >= 0 or len(real) <= 1:
            break
        real.discard(min(chains, key=lambda i: candidates[i].score))
    for i in order:  # refill what was freed, best candidates first
        par = candidates[i].parent
        if i in real or (par != -1 and par not in real):
            continue
        reclaimed = chains.get(par, 0)  # a padded leaf parent's chain goes over to i
        room = free - 1 + reclaimed     # the chain that still fits under i
        if room < 0:
            continue
        chains.pop(par, None)
        chains[i] = min(max(0, depth - candidates[i].depth), room)
        real.add(i)
        free -= 1 + chains[i] - reclaimed
    index: dict[int, int] = {}
    out: list[Node] = []
    for i in sorted(real):
        index[i] = len(out)
        out.append(replace(candidates[i], parent=-1 if candidates[i].parent == -1 else index[candidates[i].parent]))
    trunk = _trunk(out)
    for i, length in chains.items():
        par = index[i]
        for d in range(candidates[i].depth + 1, candidates[i].depth + length + 1):
            src = out[trunk[d]]
            out.append(Node(src.token, par, src.score, d, borrowed=True))
            par = len(out) - 1
    # Keep parents before children: order by depth (stable), remapping parent indices.
    order = sorted(range(len(out)), key=lambda i: (out[i].depth, i))
    pos = {old: new for new, old in enumerate(order)}
    return [replace(out[i], parent=-1 if out[i].parent == -1 else pos[out[i].parent]) for i in order]


def fta_paper(tree: DraftTree) -> DraftTree:
    """The official padding: each short root->leaf path is continued by the most frequent node of
    each deeper column, verified as if it followed the leaf (gumiho/model/cnets.py:969-989: the
    padded row of `retrieve_indices`). Their logits were computed in another context, so this is
    *not* lossless. A continuation is that row and nothing else: after a borrowed node only the
    next column's node is tried, not the borrowed node's own children.

    The official code also sets the leaf's attention to those nodes (gumiho/model/cnets.py:989),
    but its target model builds the verify mask as the causal mask with the tree mask's zeros
    masked out (gumiho/model/modeling_llama_kv.py:888-921): a tree-mask one cannot open a key after
    the query, and the borrowed nodes of deeper columns always come after the leaf. So the leaf
    sees only its ancestors there, and here too: the padding adds verify-only children, no edge."""
    paths = tree.paths()
    width = max(len(p) for p in paths)
    cols: dict[int, int] = {}
    for c in range(width):
        counts = Counter(p[c] for p in paths if len(p) > c)
        cols[c] = max(counts, key=lambda n: (counts[n], -n))  # ties: the lowest node (torch.unique + argmax there)
    extra_children: dict[int, list[int]] = {}
    for p in paths:
        if len(p) == width:
            continue
        leaf = p[-1]
        borrowed = [cols[c] for c in range(len(p), width)]
        if any(b <= leaf for b in borrowed):
            continue  # the cache commit needs ascending node order
        extra_children.setdefault(leaf, []).append(borrowed[0])
    tree.extra_children = extra_children
    tree.borrowed_next = {cols[c]: cols[c + 1] for c in range(1, width - 1)} if extra_children else {}
    return tree
