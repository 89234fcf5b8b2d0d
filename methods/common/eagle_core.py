"""EAGLE's draft head, shared by EAGLE-1, EAGLE-2 and Gumiho (each only grows its tree differently).

Draft model (as released): x_i = fc([emb(t_{i+1}) ; f_i]) (2H -> H, bias), then `layers` decoder
layers of the target's own architecture (the first without its input norm, no final norm); the
output h_{i+1} is trained to equal f_{i+1}, and its tokens come from the target's frozen LM head.
f is the target's last hidden state after the final norm. The draft keeps its own KV cache of
committed context only: each cycle it consumes the accepted tokens with their target features
(`observe`); the rows it writes while expanding a tree are dropped after `propose`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from harness.core.cost_model import TreeSizer, verify_cost_curve
from harness.core.draft_layers import DecoderStack
from harness.core.errors import SpecbenchError
from harness.core.packed_linear import apply_linear
from harness.core.tree import DraftTree
from harness.core.tree_build import CandidatePool, build_tree
from methods.common.base import LearnedDrafter
from methods.common.checkpoint_io import read_config, read_state
from methods.common.config_types import integer
from methods.common.official_layout import KeyMap, OfficialFiles, exported, target_field, vocab_departure
from methods.common.losses import masked_smooth_l1

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext
    from harness.core.target import TargetOutput

# total_tokens "auto" keeps at most this many draft nodes (the cost curve is measured up to 64 tokens).
AUTO_MAX_NODES = 63


class EagleCore(LearnedDrafter):
    """fc + decoder layers on (token, feature) pairs, with a draft KV cache of committed context."""

    # draft_vocab: see methods/common/draft_vocab.py (0 = the full target vocab, as the released checkpoints).
    defaults: dict[str, Any] = {"layers": 1, "fc_bias": True, "layer_config": None, "rollout_steps": 1,
                                "draft_vocab": 8192, "weights": "native"}
    arch_keys = ("layers", "fc_bias", "layer_config", "rollout_steps", "draft_vocab")
    # top_k, depth and total_tokens: the dynamic trees' (EAGLE-2, EAGLE-3, Gumiho).
    config_types = {"layers": integer(1), "rollout_steps": integer(1), "draft_vocab": integer(0),
                    "top_k": integer(1), "depth": integer(1), "total_tokens": integer(2, words=("auto",))}
    first_input_norm = False

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        self.build_draft_model()
        self.to(device=target.device)
        self._cache = None
        self._last: torch.Tensor | None = None   # draft output at the last committed position
        self._sizer: TreeSizer | None = None       # total_tokens "auto" (EAGLE-2, Gumiho)
        self._reach = 0                            # deepest node the last sized tree kept ("auto")

    def build_draft_model(self) -> None:
        """The draft model's modules: fc (2H -> H) and `layers` decoder layers (EAGLE-3 builds its own)."""
        h = self.target.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=self.config["fc_bias"])
        self.stack = DecoderStack(self.target.config, self.config["layers"], first_input_norm=self.first_input_norm,
                                  final_norm=False, overrides=self.config["layer_config"])

    @property
    def _dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, tokens: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """fc([emb(token) ; feature]); embedding first, as the released weights expect."""
        return apply_linear(self.fc, torch.cat([self.target.embed(tokens).to(feats.dtype), feats], dim=-1))

    def draft_forward(self, tokens: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run [n] pairs on top of the draft cache; returns [n, H] outputs (rows stay in the cache)."""
        x = self.fuse(tokens, feats.to(self._dtype))[None]
        m = None if mask is None else mask[None, None]
        return self.stack(x, positions[None], self._cache, m)[0]

    def draft_topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([..., k] draft log-probs, [..., k] target token ids) of the k best drafts per row of
        draft outputs [..., H] (here through the target's head over the draft vocab)."""
        return self.vocab.draft_topk(hidden, k)

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] draft log-probs (-inf outside the draft vocab)."""
        return self.vocab.draft_logits(hidden).float().log_softmax(-1)

    # ---- decoding state -------------------------------------------------------------------
    def new_draft_cache(self, capacity: int):
        """The draft's KV cache of committed context (its layers' own kind when compiled)."""
        return self.stack.new_cache(capacity=capacity)

    def committed_features(self, source: TargetOutput | Acceptance) -> torch.Tensor:
        """[n, H] what `draft_forward` pairs with committed tokens, from a prefill or a verify step's
        accepted path: the target's last normed hidden state (EAGLE-3 fuses three layers instead)."""
        return source.hidden

    @torch.inference_mode()
    def begin(self, prompt: torch.Tensor, prefill: TargetOutput, root: int) -> None:
        n = prompt.numel()
        self._cache = self.new_draft_cache(n + 1024)
        # Pair (f_i, t_{i+1}): the token is advanced by one; the last pair takes the root.
        nxt = torch.cat([prompt[1:], torch.tensor([root])]).to(self.target.device)
        out = self.draft_forward(nxt, self.committed_features(prefill), torch.arange(n, device=self.target.device))
        self._last = out[-1]
        if self._sizer is not None:
            self._sizer.reset()
        self._reach = 1 << 30  # the first tree of an answer may use every level

    @torch.inference_mode()
    def observe(self, step: Acceptance) -> None:
        # Accepted nodes' features pair with the next accepted token; the last with the bonus.
        toks = torch.cat([step.tokens[1:], torch.tensor([step.bonus])]).to(self.target.device)
        start = self._cache.length
        out = self.draft_forward(toks, self.committed_features(step),
                                 torch.arange(start, start + toks.numel(), device=toks.device))
        self._last = out[-1]
        if self._sizer is not None:
            self._sizer.observe(step.accepted)

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """Dynamic trees (EAGLE-2, Gumiho): `total_tokens` counts the root, so N drafts is N + 1."""
        return {"total_tokens": budget if budget == "auto" else int(budget) + 1}

    @classmethod
    def candidates(cls, config: dict[str, Any]) -> int:
        """How many candidates a dynamic tree keeps its nodes from: `top_k` beams expanded `depth`
        times (`dynamic_tree`), top_k + depth * top_k^2."""
        return config["top_k"] + config["depth"] * config["top_k"] ** 2

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """A fixed tree budget (`total_tokens`) the candidates cannot fill is refused, not capped."""
        total = config.get("total_tokens", "auto")
        if total != "auto" and total - 1 > cls.candidates(config):
            raise SpecbenchError(
                f"method '{cls.name}': total_tokens={total} asks for {total - 1} draft tokens per verify, but its "
                f"tree keeps at most {cls.candidates(config)} (top_k {config['top_k']}, depth {config['depth']}); "
                "lower --tree-budget / total_tokens, or raise top_k or depth")

    def tree_budget(self, scores: list[float]) -> int:
        """Draft nodes a dynamic tree keeps out of candidates with these cumulative log-probs:
        `total_tokens - 1`, or with total_tokens "auto" the size that pays most on this machine
        (the verify cost curve measured here, the answer's own acceptance: harness/core/cost_model)."""
        total = self.config["total_tokens"]
        if total != "auto":
            return int(total) - 1
        if self._sizer is None:
            self._sizer = TreeSizer(verify_cost_curve(self.target), max_keep=AUTO_MAX_NODES)
        return self._sizer.budget(sorted(scores, reverse=True))

    def auto_depth(self, depth: int) -> int:
        """Depth levels worth drafting this step. A sized tree (total_tokens "auto") keeps only
        what pays (a few nodes where a wide verify is dear), so drafting levels it never keeps is
        work for nothing: draft one level deeper than the last tree kept (it can grow back by a
        level per step). Fixed budgets draft every level."""
        if self.config["total_tokens"] != "auto":
            return depth
        return min(depth, self._reach + 1)

    def note_kept(self, nodes) -> None:
        """Record the deepest level the sized tree kept (see `auto_depth`)."""
        self._reach = max((n.depth for n in nodes if not n.borrowed), default=1)

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

    # ---- EAGLE-2's dynamic tree (EAGLE-2 and EAGLE-3) ------------------------------------
    def dynamic_tree(self, ctx: DraftContext) -> DraftTree:
        """EAGLE-2's tree (methods/eagle2.py says how): `top_k` beams expanded `depth` times, every
        child pooled with its cumulative draft log-prob, the best `tree_budget` of them kept."""
        k = self.config["top_k"]
        # Expansion step s drafts tree level s + 2 (the root pass gives level 1).
        depth = max(0, self.auto_depth(min(self.config["depth"], ctx.max_nodes - 2) + 1) - 1)
        dev = self.target.device
        committed = self._cache.length
        top_score, top_tok = self.draft_topk(self._last, k)
        pool = CandidatePool()
        beam = pool.add(top_tok.tolist(), top_score.tolist(), [-1] * k)  # candidate ids of the current beam
        beam_feat = self._last.expand(k, -1)   # output of each beam's parent
        anc_rows: dict[int, list[int]] = {-1: []}  # candidate -> cached tree rows of it and its ancestors
        n_rows = 0
        for step in range(depth):
            toks = torch.tensor([pool.tokens[c] for c in beam], device=dev)
            mask = self.tree_mask(committed, [anc_rows[pool.parents[c]] for c in beam], n_rows)
            pos = torch.full((len(beam),), committed + step, device=dev)
            out = self.draft_forward(toks, beam_feat, pos, mask)
            for j, c in enumerate(beam):
                anc_rows[c] = anc_rows[pool.parents[c]] + [n_rows + j]
            n_rows += len(beam)
            child_score, child_tok = self.draft_topk(out, k)      # [beams, k]
            cu = torch.tensor([pool.scores[c] for c in beam])[:, None] + child_score.cpu()
            children = pool.add(child_tok.flatten().tolist(), cu.flatten().tolist(), [c for c in beam for _ in range(k)])
            best = torch.topk(cu.flatten(), min(k, cu.numel())).indices.tolist()
            beam = [children[b] for b in best]
            beam_feat = out[[b // k for b in best]]
        self._cache.crop_to(committed)
        self.last_pool_size = len(pool)  # k + depth * k^2 (tests check it)
        nodes = pool.select(self.tree_budget(pool.scores), ctx.max_nodes)
        self.note_kept(nodes)
        return build_tree(ctx.root, nodes)

    # ---- training -------------------------------------------------------------------------
    def serial_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """SmoothL1(h_{i+1}, f_{i+1}) + 0.1 soft-CE against the target's distribution, on pairs
        (f_i noised, t_{i+1}) where t_{i+1} is an answer token. Returns (h, terms); h[:, i] ~ f_{i+1}.

        With `rollout_steps` k > 1 (EAGLE-3's "training-time test"), steps 2..k feed the draft's
        own predicted features forward as inference does: the chain starting at pair j sees the
        true context up to j and its own earlier steps, never later true features; step s is
        scored against f_{j+s} with weight 0.8^(s-1)."""
        full_mask = batch.loss_mask * batch.attention_mask
        outs = self.rollout(batch.features, batch.input_ids)
        total = batch.features.new_zeros(())
        out: dict[str, torch.Tensor] = {}
        for step, h in enumerate(outs, start=1):
            n = h.shape[1]
            target = batch.target_features[:, step : step + n]
            mask = full_mask[:, step : step + n]
            v = masked_smooth_l1(h, target, mask)
            p, acc = self.vocab.head_ce(h, mask, target_hidden=target)
            total = total + 0.8 ** (step - 1) * (v + 0.1 * p)
            sfx = "" if step == 1 else str(step)
            out.update({f"vloss{sfx}": v.detach(), f"ploss{sfx}": p.detach(), f"acc{sfx}": acc.detach()})
        out["loss"] = total
        return outs[0], out

    def rollout(self, features: torch.Tensor, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """Draft outputs per unrolled step: step s for the chain starting at pair j predicts f_{j+s}."""
        f_in = features[:, :-1]
        b, t, _ = f_in.shape
        x0 = self.fuse(input_ids[:, 1:], f_in)
        pos0 = torch.arange(t, device=f_in.device)
        outs = [self.stack(x0, pos0[None].expand(b, t))]
        blocks, positions = [x0], [pos0]
        for step in range(2, self.config["rollout_steps"] + 1):
            n = t - (step - 1)
            if n <= 0:
                break
            blocks.append(self.fuse(input_ids[:, step : step + n], outs[-1][:, :n]))
            positions.append(torch.arange(n, device=f_in.device) + step - 1)
            x = torch.cat(blocks, dim=1)
            pos = torch.cat(positions)[None].expand(b, -1)
            h = self.stack(x, pos, mask=self._rollout_mask([blk.shape[1] for blk in blocks], f_in.device))
            outs.append(h[:, -n:])
        return outs

    @staticmethod
    def _rollout_mask(lengths: list[int], device) -> torch.Tensor:
        """Boolean [1, 1, Q, Q] over concatenated step blocks: block 0 (true pairs) is causal; a
        query of step block s for chain j sees true pairs <= j and chain j's own step blocks <= s."""
        q = sum(lengths)
        m = torch.zeros(q, q, dtype=torch.bool, device=device)
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        t = lengths[0]
        m[:t, :t] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        for s in range(1, len(lengths)):
            n = lengths[s]
            rows = starts[s] + torch.arange(n, device=device)
            m[rows[:, None], torch.arange(t, device=device)[None]] = (
                torch.arange(t, device=device)[None] <= torch.arange(n, device=device)[:, None])
            for s2 in range(1, s + 1):
                m[rows, starts[s2] + torch.arange(n, device=device)] = True
        return m[None, None]

    def loss(self, batch) -> dict[str, torch.Tensor]:
        return self.serial_loss(batch)[1]

    # ---- official checkpoints ------------------------------------------------------------
    # Released EAGLE keys <-> ours: fc.* as is, layers.N.* <-> stack.layers.N.*. The file's copy of
    # the target's embedding is skipped when read (we reuse the target's) and written from it.
    official_keys: ClassVar[KeyMap] = KeyMap(pairs=(("layers.", "stack.layers."), ("fc.", "fc.")),
                                             official_only=("embed_tokens.", "rotary_emb"), ours_only=("draft_ids",))
    # Where the official code drafts over the target's whole vocabulary (file:line).
    official_head: ClassVar[str] = "Spec-Bench model/eagle2/cnets.py:689, SafeAILab/EAGLE eagle/model/cnets1.py:702"

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "EagleCore":
        state = read_state(folder, cls.weights_name())
        cfg = read_config(folder, cls.weights_name())
        if cfg.get("hidden_size", target.hidden_size) != target.hidden_size:
            raise SpecbenchError(f"{folder} is for hidden size {cfg.get('hidden_size')}, target has {target.hidden_size}")
        mapped = cls.official_keys.to_ours(state)
        layers = 1 + max(int(k.split(".")[2]) for k in mapped if k.startswith("stack.layers."))
        arch = {"layers": layers, "fc_bias": "fc.bias" in mapped, "layer_config": draft_layer_config(cfg, target),
                "draft_vocab": 0}
        drafter = cls(target, {**arch, **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """EAGLE's release layout, which EAGLE-2 reads too (SafeAILab/EAGLE; Spec-Bench's EAGLE and
        EAGLE-2): pytorch_model.bin with fc.*, layers.N.* and the target's embedding (Spec-Bench
        loads it strictly: model/eagle2/ea_model.py:68), and the config.json its EConfig reads,
        with `bias` for fc's (ea_model.py:49-53) and `qkv_bias` where the layers have one."""
        weights = {"embed_tokens.weight": exported(self.target.embed_tokens.weight)}
        weights.update({k: exported(v) for k, v in self.official_keys.to_official(self.state_dict()).items()})
        config = {**official_draft_config(self.target, self.config["layer_config"], self.config["layers"]),
                  "bias": bool(self.config["fc_bias"])}
        if "layers.0.self_attn.q_proj.bias" in weights:
            config["qkv_bias"] = True  # the official layers read it with hasattr: absent means none
        return OfficialFiles(weights, "pytorch_model.bin", config, self.official_departures())

    def official_departures(self) -> list[str]:
        """What EAGLE's layout cannot say about this drafter, one line each."""
        return vocab_departure(self, self.official_head) + rope_scaling_departure(self.target)


# The draft layer's config fields a released config.json holds, read into `layer_config` where
# they differ from the target's (`draft_layer_config`) and written from it (`official_draft_config`).
LAYER_FIELDS = ("intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                "hidden_act")


def draft_layer_config(draft_cfg: dict, target) -> dict | None:
    """Fields of a released draft's config.json that differ from the target's (None when none do)."""
    out = {key: draft_cfg[key] for key in LAYER_FIELDS
           if key in draft_cfg and draft_cfg[key] != target_field(target.config, key)}
    return out or None


def official_draft_config(target, layer_config: dict | None, layers: int) -> dict[str, Any]:
    """The config.json of a draft in the EAGLE family's layout, as EConfig reads it (SafeAILab/EAGLE
    eagle/model/configs.py:77-124): the target's sizes with the draft layer's own `layer_config`,
    `num_hidden_layers` = `layers`, and rope_theta written out (the drafts read it with hasattr:
    eagle/model/cnets1.py:222-225). Their layers take head_dim = hidden / heads; one that differs
    has no place in the layout."""
    tc = target.config
    fields = {key: target_field(tc, key) for key in LAYER_FIELDS} | dict(layer_config or {})
    heads = fields["num_attention_heads"]
    head_dim = getattr(tc, "head_dim", None) if not (layer_config or {}).get("num_attention_heads") else None
    if head_dim is not None and head_dim * heads != tc.hidden_size:
        raise SpecbenchError(f"target '{target.name}' has head_dim {head_dim} with {heads} heads of hidden size "
                             f"{tc.hidden_size}: the official EAGLE-family layers take hidden / heads; no official "
                             "layout holds this draft")
    pad = getattr(tc, "pad_token_id", None)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": tc.hidden_size,
            "num_hidden_layers": layers, **fields, "vocab_size": target.vocab_size,
            "max_position_embeddings": tc.max_position_embeddings, "rope_scaling": None, "pretraining_tp": 1,
            "pad_token_id": pad if isinstance(pad, int) and 0 <= pad < target.vocab_size else None,
            "bos_token_id": getattr(tc, "bos_token_id", None), "eos_token_id": getattr(tc, "eos_token_id", None),
            "tie_word_embeddings": False, "torch_dtype": "float32"}


def rope_scaling_departure(target) -> list[str]:
    """A target RoPE with scaling has no place in EConfig (only linear/dynamic pass its check:
    SafeAILab/EAGLE eagle/model/configs.py:126-150); the export writes none."""
    params = getattr(target.config, "rope_parameters", None) or {}
    kind = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    if kind == "default":
        return []
    return [f"RoPE scaling: the target's rope_type '{kind}' has no place in the official config (EConfig takes "
            "none, linear or dynamic: eagle/model/configs.py:126-150); written without it"]
