"""EAGLE-3 (Li et al., 2025, arXiv 2503.01840): a draft that reads three of the target's layers and
is trained on its own outputs (the "training-time test").

Draft model (SafeAILab/EAGLE `eagle/model/cnets.py`): the inputs of target layers 2, L//2 and L-3
(low, middle, high: `feature_layers`, handed over by the decode loop at prefill and at every
verify), concatenated (3H), go through `fc` (3H -> H, no bias); then one decoder layer whose
q/k/v read [input_layernorm(emb(t_{i+1})) ; hidden_norm(x_i)] (2H) and whose residual is x_i;
then `norm` and the draft's own `lm_head` over a pruned draft vocabulary (`draft_vocab` ids, the
most frequent answer tokens: `d2t[j]` = target id - j and `t2d` marks the target ids in it, the
official buffers). Tree levels after the first feed the layer's own (pre-norm) output back as x.
No feature regression: the only loss is soft cross-entropy against the target's distribution.

Training (`eagle/traineagle3/cnets.py`): `ttt_steps` unrolled steps. Step s feeds every position
its step s-1 output with the token s further on, at position i + s; its query sees the true pairs
0..i (step 0's keys, causally) and its own chain's keys of steps 1..s at index i, as a tree path
at inference does. Loss: sum over s of 0.8^s CE(target's distribution renormalised over the draft
vocab, draft), on answer positions whose target top-1 is in the draft vocab (the official mask).
Differences from the official trainer: the CE is averaged over the masked positions (the official
averages over every position of the batch), and the target's features are precomputed (feature
shards, harness/train/features.py) instead of recomputed in every step.

Tree: EAGLE-2's dynamic tree (`EagleCore.dynamic_tree`), sized for this machine by default;
`preset=paper` is the official EAGLE-3 setting (top-k 10, 7 expansion steps, 60 tokens).
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.core.draft_layers import DecoderStack
from harness.core.errors import SpecbenchError, unknown
from harness.core.kvcache import KVCache
from harness.core.layer_math import FusedWeights, fuse_weights, fused_tensors, layer_step
from harness.core.packed_linear import apply_linear, tensors_key
from harness.core.tree import DraftTree
from methods.common.checkpoint_io import read_config, read_state
from methods.common.config_types import integer
from methods.common.eagle_core import EagleCore, draft_layer_config, official_draft_config, rope_scaling_departure
from methods.common.losses import CHUNK_ELEMENTS
from methods.common.official_layout import KeyMap, OfficialFiles, exported

if TYPE_CHECKING:
    from harness.core.decode import Acceptance, DraftContext
    from harness.core.target import TargetOutput

# The official EAGLE-3 tree (`EaModel.from_pretrained` defaults): top-k 10, depth 7, 60 tokens.
PAPER_PRESET = {"top_k": 10, "depth": 7, "total_tokens": 60}
LAYER_NAMES = ("low", "mid", "high")  # the three captures, in eagle3_layers' order
TTT_DECAY = 0.8  # weight of unrolled step s is 0.8^s (traineagle3/main.py)


def eagle3_layers(num_layers: int) -> tuple[int, int, int]:
    """The official capture: the inputs of target layers 2, L//2 and L-3 (low, middle, high)."""
    return (2, num_layers // 2, num_layers - 3)


def shifted(t: torch.Tensor, n: int) -> torch.Tensor:
    """[B, T, ...] -> row i holds t[:, i + n] (zeros past the end)."""
    out = torch.zeros_like(t)
    if n < t.shape[1]:
        out[:, : t.shape[1] - n] = t[:, n:]
    return out


class Eagle3(EagleCore):
    """EAGLE-3: three-layer feature fusion, one 2H-input decoder layer, its own pruned-vocab head,
    trained with the training-time test; EAGLE-2's dynamic tree."""

    name = "eagle3"
    display_name = "EAGLE-3"
    paper = "Li et al., 2025 (arXiv 2503.01840)"
    year = 2025
    color = "#882255"
    order = 65
    checkpoint_layout = ("SafeAILab/EAGLE (EAGLE-3): config.json + pytorch_model.bin or model.safetensors "
                         "(midlayer.*, fc.weight, norm.weight, lm_head.weight, d2t, t2d)")
    feature_layers = staticmethod(eagle3_layers)
    input_noise = False  # the official trainer adds no feature noise (and `features` is not read here)
    defaults: dict[str, Any] = {
        # draft_vocab: ids of the draft's own head (0 or >= the target's vocab: all of them, no d2t/t2d).
        # fuse_layers: which captures fc fuses (an ablation of the fusion: "high" reads one layer).
        "layer_config": None, "draft_vocab": 8192, "ttt_steps": 7, "fuse_layers": "low,mid,high", "weights": "native",
        # As EAGLE-2 (the tree sized per step from this machine's verify cost curve), one level deeper.
        "top_k": 8, "depth": 6, "total_tokens": "auto",
        "preset": "default",
    }
    arch_keys = ("layer_config", "draft_vocab", "ttt_steps", "fuse_layers")
    config_types = {"ttt_steps": integer(1)}
    full_vocab_paper = False  # EAGLE-3's own draft vocabulary (d2t/t2d) is the paper's

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """The paper unrolls the training-time test 7 steps and fuses all three layers."""
        out = [] if int(config.get("ttt_steps", 7)) == 7 else [f"{config['ttt_steps']}-step TTT"]
        fused = config.get("fuse_layers", "low,mid,high")
        return out + ([] if fused == "low,mid,high" else [f"fuses {fused}"])

    @classmethod
    def resolve_config(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        cfg = super().resolve_config(overrides)
        if cfg["preset"] == "paper":
            cfg.update({k: v for k, v in PAPER_PRESET.items() if k not in overrides})
        elif cfg["preset"] != "default":
            raise unknown("eagle3 preset", str(cfg["preset"]), ["default", "paper"])
        if int(cfg["ttt_steps"]) < 1:
            raise SpecbenchError(f"eagle3: ttt_steps must be >= 1, got {cfg['ttt_steps']}")
        names = [x.strip() for x in str(cfg["fuse_layers"]).split(",") if x.strip()]
        if not names or len(set(names)) < len(names) or not set(names) <= set(LAYER_NAMES):
            raise SpecbenchError(f"eagle3: fuse_layers takes distinct names from {', '.join(LAYER_NAMES)} "
                                 f"(comma-separated), got '{cfg['fuse_layers']}'")
        cfg["fuse_layers"] = ",".join(n for n in LAYER_NAMES if n in names)
        return cfg

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        layers = eagle3_layers(target.num_layers)
        if len(set(layers)) < 3 or layers[0] >= target.num_layers:
            raise SpecbenchError(f"eagle3 reads three distinct target layers (2, L//2, L-3); target "
                                 f"'{target.name}' has {target.num_layers} layers: it needs at least 7")
        super().__init__(target, config)

    def target_layers(self) -> list[int]:
        """The captures `fuse_layers` names (all three by default), in eagle3_layers' order."""
        names = self.config["fuse_layers"].split(",")
        return [i for n, i in zip(LAYER_NAMES, eagle3_layers(self.target.num_layers)) if n in names]

    def uses_target_head(self) -> bool:
        return False  # its own lm_head over the draft vocab

    def build_draft_model(self) -> None:
        t = self.target
        h = t.hidden_size
        self.fc = nn.Linear(len(self.target_layers()) * h, h, bias=False)
        parts = DecoderStack(t.config, 1, final_norm=True, overrides=self.config["layer_config"])
        if not parts.fast_decode_supported:
            raise SpecbenchError(f"eagle3 runs its layer as a Llama/Qwen2/Mistral-style layer; target "
                                 f"'{t.name}' has {type(parts.layers[0]).__name__} layers")
        layer = parts.layers[0]
        for name in ("q_proj", "k_proj", "v_proj"):  # q/k/v read [emb ; hidden]: 2H
            old = getattr(layer.self_attn, name)
            setattr(layer.self_attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        layer.hidden_norm = copy.deepcopy(layer.input_layernorm)
        self.midlayer, self.norm, self.rotary_emb = layer, parts.norm, parts.rotary_emb
        n = self.draft_vocab_size
        self.lm_head = nn.Linear(h, n or t.vocab_size, bias=False)
        # Official buffers: target id = j + d2t[j]; t2d[id] marks the ids in the draft vocab.
        # Until `set_draft_vocab` or a checkpoint fills them: the first n ids.
        self.register_buffer("d2t", torch.zeros(n, dtype=torch.long) if n else None)
        self.register_buffer("t2d", (torch.arange(t.vocab_size) < n) if n else None)
        self._fused: tuple | None = None

    # ---- the draft vocabulary -------------------------------------------------------------
    @property
    def draft_vocab_size(self) -> int:
        """Ids of the pruned draft vocabulary (0: the whole target vocabulary)."""
        n = int(self.config["draft_vocab"] or 0)
        return n if 0 < n < self.target.vocab_size else 0

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        """Use these `draft_vocab` target ids as the draft vocabulary (sorted, as the official scan)."""
        n = self.draft_vocab_size
        if ids.numel() != n:
            raise SpecbenchError(f"eagle3's draft vocab needs {n} ids, got {ids.numel()}")
        ids = ids.sort().values.to(self.d2t.device)
        self.d2t.copy_(ids - torch.arange(n, device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_ids(self) -> torch.Tensor:
        """[n] the target id of each draft index (d2t applied)."""
        if self.d2t is None:
            return torch.arange(self.target.vocab_size, device=self.lm_head.weight.device)
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def draft_topk(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer outputs [..., H] -> ([..., k] draft log-probs, [..., k] target ids) through the
        draft's own norm and head; draft indices become target ids through d2t."""
        logits = apply_linear(self.lm_head, self.norm(hidden.to(self._dtype)))
        top = logits.float().log_softmax(-1).topk(k)
        ids = top.indices if self.d2t is None else top.indices + self.d2t[top.indices]
        return top.values, ids

    # ---- decoding -------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftTree:
        return self.dynamic_tree(ctx)

    def committed_features(self, source: TargetOutput | Acceptance) -> torch.Tensor:
        """fc(inputs of the fused target layers: low, middle and high) [n, H] at committed positions."""
        if not source.layers:
            raise SpecbenchError("eagle3 needs the inputs of the target's layers "
                                 f"{self.target_layers()}: run it through harness.core.decode, which passes them")
        dev = self.fc.weight.device  # a sharded target's layers may sit elsewhere
        feats = torch.cat([source.layers[i].to(dev) for i in self.target_layers()], dim=-1)
        return apply_linear(self.fc, feats.to(self._dtype))

    def new_draft_cache(self, capacity: int) -> KVCache:
        return KVCache(1, capacity)

    def _fused_weights(self) -> FusedWeights:
        """The layer's fused (packed on bf16 CPUs) projections, rebuilt when a weight changes."""
        key = tensors_key(fused_tensors(self.midlayer))
        if self._fused is None or self._fused[0] != key:
            self._fused = (key, fuse_weights(self.midlayer))
        return self._fused[1]

    def draft_forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """[n] (token, x) pairs on top of the draft cache -> [n, H] layer outputs (pre-norm; the
        rows stay in the cache). x [n, H]: `committed_features` for committed pairs, a parent's
        output for tree nodes. mask: bool [n, cached + n] (None: causal)."""
        layer = self.midlayer
        x = hidden.to(self._dtype)[None]
        emb = self.target.embed(tokens).to(self._dtype)[None]
        attn_in = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(x)], dim=-1)
        cos, sin = self.rotary_emb(x, position_ids=positions[None])
        n, past = x.shape[1], self._cache.length
        if mask is None and n > 1:
            mask = torch.ones(n, past + n, dtype=torch.bool, device=x.device)
            mask[:, past:] = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        m = None if mask is None else mask[None, None]
        return layer_step(layer, self._fused_weights(), x, cos, sin, self._cache.layers[0].update, m, attn_in)[0]

    # ---- training: the training-time test ---------------------------------------------------
    @torch.no_grad()
    def teacher(self, target_features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's next-token distribution at every position, renormalised over the draft
        vocab ([..., n]), and whether its top-1 over the whole vocab is in the draft vocab
        ([...], float): target_features [..., H] are the target's last normed hidden states."""
        lead, h = target_features.shape[:-1], target_features.shape[-1]
        flat = target_features.reshape(-1, h)
        ids = self.draft_ids() if self.d2t is not None else None
        probs = flat.new_empty(flat.shape[0], self.lm_head.out_features, dtype=torch.float32)
        keep = flat.new_ones(flat.shape[0], dtype=torch.float32)
        rows = max(1, CHUNK_ELEMENTS // self.target.vocab_size)
        for s in range(0, flat.shape[0], rows):
            z = self.target.project(flat[s : s + rows].to(self.target.dtype)).float()
            if ids is not None:
                keep[s : s + rows] = self.t2d[z.max(-1).indices].float()  # = argmax, ~3x faster on CPU
                z = z[:, ids]
            probs[s : s + rows] = z.softmax(-1)
        return probs.reshape(*lead, -1), keep.reshape(lead)

    def ttt_layer(self, emb: torch.Tensor, x: torch.Tensor, positions: torch.Tensor, keys: list[torch.Tensor],
                  values: list[torch.Tensor], causal: torch.Tensor) -> torch.Tensor:
        """One unrolled step of the draft layer, with autograd. emb, x: [B, T, H]; positions [T]
        (i + s at step s); causal [T, T] bool. Query i sees step 0's keys j <= i (the true pairs)
        and, at index i, the keys of steps 1..s (its own chain). Appends this step's keys/values."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        layer, attn = self.midlayer, self.midlayer.self_attn
        b, t, _ = x.shape
        h_in = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(x)], dim=-1)
        q, k, v = (proj(h_in).view(b, t, -1, attn.head_dim).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        cos, sin = self.rotary_emb(x, position_ids=positions[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys.append(k)
        values.append(v)
        rep = q.shape[1] // k.shape[1]  # grouped-query attention: kv heads serve `rep` query heads each
        k0, v0 = keys[0].repeat_interleave(rep, 1), values[0].repeat_interleave(rep, 1)
        scores = (q @ k0.transpose(-1, -2) * attn.scaling).masked_fill(~causal, float("-inf"))  # [B, nh, T, T]
        diag = [(q * kr.repeat_interleave(rep, 1)).sum(-1, keepdim=True) * attn.scaling for kr in keys[1:]]
        w = torch.cat([scores, *diag], dim=-1).softmax(-1, dtype=torch.float32).to(q.dtype)
        o = w[..., :t] @ v0
        for j, vr in enumerate(values[1:]):
            o = o + w[..., t + j : t + j + 1] * vr.repeat_interleave(rep, 1)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def unroll(self, batch) -> list[torch.Tensor]:
        """The layer's outputs [B, T, H] of each unrolled step: step s at index i sits at position
        i + s, reads token i + 1 + s and predicts token i + 2 + s."""
        if batch.layer_features is None:
            raise SpecbenchError("eagle3 trains on the inputs of the target's layers "
                                 f"{self.target_layers()}; these batches carry none (harness.train.pipeline "
                                 "loads them with layers=drafter.target_layers())")
        ids = batch.input_ids
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        x = self.fc(batch.layer_features.to(self.fc.weight.dtype))
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs = []
        for s in range(int(self.config["ttt_steps"])):
            emb = self.target.embed(shifted(ids, 1 + s)).to(x.dtype)
            x = self.ttt_layer(emb, x, pos + s, keys, values, causal)
            outs.append(x)
        return outs

    def loss(self, batch) -> dict[str, torch.Tensor]:
        """Σ_s 0.8^s soft CE of step s against the target's distribution over the draft vocab, on
        answer positions whose target top-1 is in the draft vocab; per step its CE (`ploss`,
        `ploss2`, ...) and top-1 agreement (`acc`, `acc2`, ...). Only positions that carry loss
        are projected, by the target's head and by the draft's: prompt and padding rows are a
        third or more of a batch, and the two heads most of a step's cost."""
        weight = batch.loss_mask * batch.attention_mask
        b, t = (weight > 0).nonzero(as_tuple=True)  # the positions whose next token is trained on
        probs, keep = self.teacher(batch.target_features[b, t])  # [N, n], [N]
        w = weight[b, t] * keep
        total = probs.new_zeros(())
        out: dict[str, torch.Tensor] = {}
        for s, x in enumerate(self.unroll(batch)):
            # Step s at index i predicts what the target predicts at position i + 1 + s.
            reach = t >= 1 + s
            count = w[reach].sum().clamp_min(1.0)
            rows = reach & (w > 0)
            logits = self.lm_head(self.norm(x[b[rows], t[rows] - 1 - s])).float()
            p, wr = probs[rows], w[rows]
            ce = (-(p * logits.log_softmax(-1)).sum(-1) * wr).sum() / count
            acc = ((logits.argmax(-1) == p.argmax(-1)).float() * wr).sum() / count
            total = total + TTT_DECAY ** s * ce
            sfx = "" if s == 0 else str(s + 1)
            out.update({f"ploss{sfx}": ce.detach(), f"acc{sfx}": acc.detach()})
        out["loss"] = total
        return out

    # ---- official checkpoints ------------------------------------------------------------
    # Released EAGLE-3 keys are ours (SafeAILab/EAGLE eagle/model/cnets.py:478-545); `layers.0.*`
    # (SGLang/SpecForge files) is read as `midlayer.*`; the copy of the target's embedding the
    # official module holds is skipped when read and written from the target's.
    official_keys = KeyMap(pairs=(("midlayer.", "midlayer."), ("fc.", "fc."), ("norm.", "norm."),
                                  ("lm_head.", "lm_head."), ("d2t", "d2t"), ("t2d", "t2d")),
                           official_only=("embed_tokens.", "rotary_emb"), read_aliases=(("layers.0.", "midlayer."),))

    @classmethod
    def load_official(cls, folder, target, overrides: dict[str, Any]) -> "Eagle3":
        cfg = read_config(folder, cls.name)
        mapped = official_state(read_state(folder, cls.name), target.vocab_size)
        if cfg.get("hidden_size", target.hidden_size) != target.hidden_size:
            raise SpecbenchError(f"{folder} is for hidden size {cfg.get('hidden_size')}, target has {target.hidden_size}")
        if "lm_head.weight" not in mapped:
            raise SpecbenchError(f"{folder} has no lm_head.weight: not an EAGLE-3 checkpoint (or a layout "
                                 "without the draft's own head, which this loader does not take)")
        rows = mapped["lm_head.weight"].shape[0]
        if cfg.get("draft_vocab_size", rows) != rows:
            raise SpecbenchError(f"{folder}: config.json says draft_vocab_size {cfg['draft_vocab_size']}, "
                                 f"lm_head.weight has {rows} rows")
        arch = {"layer_config": draft_layer_config(cfg, target), "draft_vocab": rows if rows < target.vocab_size else 0}
        drafter = cls(target, {**arch, **overrides})
        drafter.load_weights(folder, state=mapped)
        return drafter

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """The authors' EAGLE-3 layout (SafeAILab/EAGLE, Spec-Bench's EAGLE-3): pytorch_model.bin
        with every tensor of the official module, the target's embedding included (the module
        holds one and loads non-strictly: ea_model.py:76), and config.json with draft_vocab_size.
        The official fc always fuses the three captures (cnets.py:531-534)."""
        if self.config["fuse_layers"] != ",".join(LAYER_NAMES):
            raise SpecbenchError(f"eagle3 with fuse_layers={self.config['fuse_layers']} has no official layout: "
                                 "the official fc always reads the low, middle and high captures "
                                 "(eagle/model/cnets.py:531-534)")
        weights = {"embed_tokens.weight": exported(self.target.embed_tokens.weight)}
        weights.update({k: exported(v) for k, v in self.official_keys.to_official(self.state_dict()).items()})
        config = {**official_draft_config(self.target, self.config["layer_config"], 1),
                  "draft_vocab_size": self.draft_vocab_size or self.target.vocab_size}
        return OfficialFiles(weights, "pytorch_model.bin", config, rope_scaling_departure(self.target))


def official_state(state: dict[str, torch.Tensor], vocab_size: int) -> dict[str, torch.Tensor]:
    """Released EAGLE-3 keys -> ours (`Eagle3.official_keys`); at full vocab d2t/t2d are dropped,
    as the official loader deletes them (ea_model.py:74-75)."""
    out = Eagle3.official_keys.to_ours(state)
    head = out.get("lm_head.weight")
    if head is not None and head.shape[0] >= vocab_size:
        out.pop("d2t", None)
        out.pop("t2d", None)
    return out
