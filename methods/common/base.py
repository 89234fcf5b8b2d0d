"""The Drafter interface every method implements, its config handling, and the checkpoint
plumbing of learned drafters.

A drafter proposes a tree of draft tokens under the root; it never calls the target's forward
itself (it may reuse the target's frozen embedding and LM head). The shared loop in
`harness/core/decode.py` verifies, commits and then shows the drafter what was accepted.
The draft-vocabulary head lives in `methods/common/draft_vocab.py`, file I/O in `methods/common/checkpoint_io.py`.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from harness.core.draft_layers import DecoderStack
from harness.core.errors import SpecbenchError, did_you_mean
from harness.core.hashing import config_hash
from harness.core.packed_linear import WEIGHT_FORMATS
from harness.core.tree import DraftTree
from methods.common import checkpoint_io
from methods.common.config_types import Takes, check_values, one_of
from methods.common.draft_vocab import DraftVocabHead, flatten_vocab_key, nest_vocab_key

if TYPE_CHECKING:  # annotations only: importing the loop would pull transformers into every drafter import
    from harness.core.decode import Acceptance, DraftContext
    from harness.core.target import TargetOutput
    from methods.common.official_layout import OfficialFiles


class Drafter(nn.Module):
    """Base class. Subclasses set `name`, `defaults` (every config key with its default) and
    `arch_keys` (keys that change the weights: they are part of the checkpoint hash; the others
    are inference keys, so sweeping them never retrains)."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    # What a key takes where its default does not say it all (methods/common/config_types.py).
    config_types: ClassVar[dict[str, Takes]] = {}
    arch_keys: ClassVar[tuple[str, ...]] = ()
    trainable: ClassVar[bool] = False
    # What tables, plots and `cli.py list` show; read only through methods.registry.method_info.
    display_name: ClassVar[str] = ""      # e.g. "EAGLE-2"; empty: the name
    paper: ClassVar[str] = ""             # short citation, e.g. "Li et al., EMNLP 2024"
    year: ClassVar[int | None] = None
    color: ClassVar[str] = ""             # one colour in every figure; empty: a stable pick
    order: ClassVar[int] = 100            # position in tables (paper order; lower first)
    acceptance_rules: ClassVar[tuple[str, ...]] = ("greedy", "lossless")
    checkpoint_layout: ClassVar[str] = ""  # official checkpoint layout it loads, one line
    # Target layers whose inputs (residual states) the drafter reads at prefill and at every verify,
    # beside the last normed hidden state, as a function of the target's layer count (EAGLE-3:
    # 2, L//2, L-3); None: none. The loop passes them on as `TargetOutput.layers` / `Acceptance.layers`.
    feature_layers: ClassVar[Callable[[int], tuple[int, ...]] | None] = None

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.target = target
        self.config = self.resolve_config(config or {})

    def target_layers(self) -> list[int]:
        """`feature_layers` for this drafter's target (empty when it reads none)."""
        return [] if self.feature_layers is None else list(self.feature_layers(self.target.num_layers))

    @classmethod
    def resolve_config(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """Defaults updated with `overrides`; an unknown key, a value the key does not take
        (`config_types`) or keys that do not fit together (`check_config`) is a one-line error."""
        for key in overrides:
            if key not in cls.defaults:
                raise SpecbenchError(
                    f"method '{cls.name}' has no config key '{key}'{did_you_mean(key, cls.defaults)}; "
                    f"keys: {', '.join(sorted(cls.defaults))}"
                )
        check_values(cls, overrides)
        config = {**cls.defaults, **overrides}
        cls.check_config(config)
        return config

    @classmethod
    def check_config(cls, config: dict[str, Any]) -> None:
        """Refuse (SpecbenchError) a resolved config whose keys do not fit together; none here."""

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """How `config` departs from the paper's algorithm, one short label each (tables name a row
        "EAGLE-2 (8k draft vocab)"); [] when it is the paper's form. A method's name means its
        paper's algorithm: every variant row says what it changes."""
        return []

    @classmethod
    def arch_hash(cls, config: dict[str, Any]) -> str:
        return config_hash({k: config[k] for k in cls.arch_keys})

    @classmethod
    def create(cls, target, overrides: dict[str, Any], checkpoint: str | None = None) -> "Drafter":
        """Build the drafter for a run. Learned methods override this to find and load weights."""
        if checkpoint is not None and not cls.trainable:
            raise SpecbenchError(f"method '{cls.name}' is training-free and takes no --checkpoint")
        return cls(target, overrides).eval()

    @classmethod
    def budget_overrides(cls, budget: int | str) -> dict[str, Any]:
        """Config overrides that give this method a tree of `budget` draft tokens per verify, or
        size it for this machine ("auto"): what `--tree-budget` sets. {} for methods without a
        tree budget (prompt lookup, SpS: their chains have their own length keys)."""
        return {}

    # ---- the decoding protocol ------------------------------------------------------------
    def begin(self, prompt: torch.Tensor, prefill: TargetOutput, root: int) -> None:
        """A new sequence: `prompt` [P] ids, `prefill` holds the prompt's target hidden states
        [P, H]; `root` is the first new token."""

    def propose(self, ctx: DraftContext) -> DraftTree:
        """A tree of draft tokens under `ctx.root`, at most `ctx.max_nodes - 1` deep."""
        raise NotImplementedError

    def observe(self, step: Acceptance) -> None:
        """Accepted tokens and their target features after a verify step."""

    # ---- the compiled runtime (--compile) ---------------------------------------------------------
    def enable_compile(self, mode: str | None = None) -> None:
        """Run the drafter's own decoder layers (its DecoderStacks) as compiled graphs when decoding
        (harness/core/runtime.py; `mode`: inductor's, its default there); call it once the weights
        are loaded. Drafters without layers (pld, Medusa's heads) have nothing to compile."""
        for module in self.modules():
            if isinstance(module, DecoderStack) and module.fast_decode_supported:
                module.enable_compile(mode)

    def runtimes(self) -> list:
        """The drafter's compiled stacks (warm-ups compile their buckets before anything is timed)."""
        return [m.runtime for m in self.modules() if isinstance(m, DecoderStack) and m.runtime is not None]

    # ---- training and checkpoints (learned drafters) -----------------------------------------
    def loss(self, batch) -> dict[str, torch.Tensor]:
        raise SpecbenchError(f"method '{self.name}' is training-free: there is nothing to train")

    def checkpoint_hash(self) -> str | None:
        """Hash of the weights in use (None for training-free methods)."""
        return None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


class LearnedDrafter(Drafter):
    """A drafter with weights: checkpoint folders hold `config.json` (method, architecture config,
    target name, vocab hash, sizes, training summary) and `model.safetensors` with the drafter's
    own weights only (the target's frozen embedding and LM head are never copied)."""

    trainable = True
    config_types = {"weights": one_of(*WEIGHT_FORMATS)}
    default_lr: ClassVar[float] = 1e-3
    weights_from: ClassVar[str | None] = None  # EAGLE-2 reads EAGLE's weights
    full_vocab_paper: ClassVar[bool] = True    # the paper drafts from the whole vocabulary (not EAGLE-3)

    def __init__(self, target, config: dict[str, Any] | None = None) -> None:
        super().__init__(target, config)
        # `weights`: the format drafting reads its weights in (harness/core/packed_linear.py).
        if self.config.get("weights", "native") not in WEIGHT_FORMATS:
            raise SpecbenchError(f"method '{self.name}': weights={self.config['weights']!r} is not one of "
                                 f"{', '.join(WEIGHT_FORMATS)}; e.g. --set {self.name}.weights=int8")
        # Draft logits through the target's frozen LM head, over a draft vocabulary where one applies.
        size = int(self.config.get("draft_vocab") or 0) if self.uses_target_head() else 0
        self.vocab = DraftVocabHead(target, size)
        # Checkpoints name the head's ids `draft_ids`, not `vocab.draft_ids`.
        self.register_state_dict_post_hook(flatten_vocab_key)
        self.register_load_state_dict_pre_hook(nest_vocab_key)

    @classmethod
    def departures(cls, config: dict[str, Any]) -> list[str]:
        """A draft vocabulary is a departure where the paper drafts from every id (`full_vocab_paper`)."""
        size = int(config.get("draft_vocab") or 0) if config.get("share_lm_head", True) else 0
        return [f"{size // 1024}k draft vocab"] if cls.full_vocab_paper and 0 < size < (1 << 30) else []

    def uses_target_head(self) -> bool:
        """Whether draft logits come from the target's frozen LM head (where a draft vocab applies):
        always, unless a method's `share_lm_head` is off (Medusa/Hydra heads with their own projection)."""
        return bool(self.config.get("share_lm_head", True))

    # The training layer's view of the head (harness/train: pipeline, tree_search).
    @property
    def draft_vocab_size(self) -> int:
        return self.vocab.size

    def set_draft_vocab(self, ids: torch.Tensor) -> None:
        self.vocab.set_draft_vocab(ids)

    def vocab_ranks(self, hidden: torch.Tensor, labels: torch.Tensor, proj: nn.Module | None = None) -> torch.Tensor:
        return self.vocab.vocab_ranks(hidden, labels, proj)

    @classmethod
    def checkpoint_name(cls, config: dict[str, Any]) -> str:
        """Folder name of the weights for `config`: the method, plus the architecture hash when an
        architecture key is off its default."""
        base = cls.weights_name()
        defaults = {k: cls.defaults[k] for k in cls.arch_keys}
        if {k: config[k] for k in cls.arch_keys} == defaults:
            return base
        return f"{base}-{cls.arch_hash(config)}"

    def checkpoint_hash(self) -> str | None:
        return getattr(self, "_weights_hash", None)

    @classmethod
    def weights_name(cls) -> str:
        """The method whose weights this drafter reads and writes (EAGLE-2: 'eagle')."""
        return cls.weights_from or cls.name

    def save_pretrained(self, path: str | Path, training: dict | None = None) -> None:
        meta = {"format": "specbench", "method": self.weights_name(),
                "arch": {k: self.config[k] for k in self.arch_keys}, "target": self.target.name,
                "vocab_hash": self.target.vocab_hash(), "hidden_size": self.target.hidden_size,
                "vocab_size": self.target.vocab_size, "parameters": self.num_parameters(), "training": training}
        checkpoint_io.write_checkpoint(path, self.state_dict(), meta)

    @classmethod
    def from_pretrained(cls, path: str | Path, target, overrides: dict[str, Any] | None = None) -> "LearnedDrafter":
        folder = checkpoint_io.resolve_checkpoint(path)
        meta = checkpoint_io.read_config(folder, cls.weights_name())
        if meta.get("format") != "specbench":
            drafter = cls.load_official(folder, target, overrides or {})
        else:
            cls.check_meta(meta, folder, target)
            # `decode` holds inference defaults fitted to these weights (a static tree calibrated to
            # the heads, see harness/train/calibrate.py); --set still overrides them.
            drafter = cls(target, {**meta.get("arch", {}), **meta.get("decode", {}), **(overrides or {})})
            drafter.load_weights(folder / "model.safetensors")
        return drafter.eval()  # drafters decode in eval mode (Hydra's heads have dropout)

    @classmethod
    def check_meta(cls, meta: dict[str, Any], folder: Path, target) -> None:
        """A specbench checkpoint's config.json must name this method and fit `target` (sizes, tokenizer)."""
        checkpoint_io.check_meta(meta, folder, target, cls.weights_name())

    def load_weights(self, file: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Load (a mapped) state dict strictly, cast to the target's dtype, and hash it."""
        state = state if state is not None else checkpoint_io.read_weights(file, self.weights_name())
        self.load_state_strictly(state, file)
        self._weights_hash = checkpoint_io.weights_hash(state)
        self.to(device=self.target.device, dtype=self.target.dtype)

    def load_state_strictly(self, state: dict[str, torch.Tensor], file: Path) -> None:
        """Copy `state` into this drafter's parameters (cast to their dtype); every key and shape must fit."""
        checkpoint_io.check_shapes(state, self.state_dict(), file, self.weights_name(), self.target.name)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise SpecbenchError(f"{file}: weights do not fit '{self.name}' as configured "
                                 f"(missing {missing[:3]}, unexpected {unexpected[:3]})")

    @classmethod
    def load_official(cls, folder: Path, target, overrides: dict[str, Any]) -> "LearnedDrafter":
        raise SpecbenchError(f"{folder} is not a specbench checkpoint and '{cls.name}' has no official-layout loader")

    def official_files(self, base_model: str | None = None) -> OfficialFiles:
        """These weights in the paper's official layout, the inverse of `load_official` through the
        same key map (methods/common/official_layout.py), with what that layout cannot express;
        `base_model`: the base model folder the official code should load, where its config names one."""
        raise SpecbenchError(f"method '{self.name}' has no official layout to export to")

    @classmethod
    def create(cls, target, overrides: dict[str, Any], checkpoint: str | None = None) -> "Drafter":
        if checkpoint:
            return cls.from_pretrained(checkpoint, target, overrides)
        return cls.from_pretrained(cls.find_checkpoint(target.name, overrides), target, overrides)

    @classmethod
    def find_checkpoint(cls, target_name: str, overrides: dict[str, Any]) -> Path:
        """The folder of this method's trained weights (for this architecture) on `target_name`."""
        folder = cls.checkpoint_name(cls.resolve_config(overrides))
        return checkpoint_io.find_weights(target_name, folder, cls.name, cls.weights_name())
