"""DraftTree: the proposal every drafter returns, and the tensors the target needs to verify it.

A tree holds N+1 nodes: node 0 is the root (the last token the target chose, not yet in the KV
cache) and nodes 1..N are draft tokens. Parents come before children (`parents[i] < i`), so one
pass in index order builds ancestor masks and depths.

A tree may also carry `SideRows`: S more rows the target runs in the same forward for the drafter
alone (Lookahead's Jacobi window). They come after the N+1 tree rows, see what their own mask
says, and no tree row sees them, so the acceptance rule reads the same logits with or without
them; the loop hands their logits to the drafter and never keeps their cache rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch


@dataclass
class SideRows:
    """Rows a drafter adds to the verify forward for its own use, never verified or committed.

    tokens [S]; offsets [S]: each row's position minus the root's; mask [S, N+1+S] bool: which of
    the root, the N draft nodes and the S side rows (in that order) each row sees. The cached
    prefix is always seen. In the prefill (`Drafter.prefill_rows`) the same rows hang under the
    prompt's last token as under a root with no draft nodes: mask [S, 1+S], offsets from it.
    """

    tokens: torch.Tensor
    offsets: torch.Tensor
    mask: torch.Tensor

    def __post_init__(self) -> None:
        self.tokens = self.tokens.reshape(-1).long().cpu()
        self.offsets = self.offsets.reshape(-1).long().cpu()
        self.mask = self.mask.bool().cpu()
        if self.offsets.numel() != self.tokens.numel() or self.mask.dim() != 2 \
                or self.mask.shape[0] != self.tokens.numel():
            raise ValueError(f"side rows: {self.tokens.numel()} tokens, {self.offsets.numel()} offsets, "
                             f"mask {list(self.mask.shape)}")

    @property
    def size(self) -> int:
        return self.tokens.numel()


@dataclass
class DraftTree:
    """tokens: [N+1] token ids (tokens[0] is the root); parents: [N+1] (parents[0] = -1).

    `q`, optional, is for drafts *sampled* from a draft distribution (EAGLE-1 at T > 0):
    q[i] is the distribution over node i's children from which they were drawn, in the order
    the children appear. None means deterministic (point-mass) drafts.
    `scores` is free for the drafter (e.g. cumulative draft log-probs), carried for records.
    `extra_mask` optionally adds attention edges beyond the ancestors (Gumiho's paper-FTA):
    a list of (query_node, key_node) pairs. It makes the tree lossy, on purpose.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    extra_mask: list[tuple[int, int]] = field(default_factory=list)
    # Verifier-only edges (Gumiho's paper-FTA): node -> extra nodes tried as if they were its children;
    # once the walk has taken such an edge, it goes on only through `borrowed_next` (node -> the one
    # node tried after it), whatever real children the borrowed nodes have.
    extra_children: dict[int, list[int]] = field(default_factory=dict)
    borrowed_next: dict[int, int] = field(default_factory=dict)
    side: SideRows | None = None  # rows for the drafter alone, after the tree's (SideRows)

    def __post_init__(self) -> None:
        # Host tensors: the acceptance rule walks them in Python; `verify_inputs` makes the
        # device copies the target's forward takes, once per verify.
        self.tokens = self.tokens.reshape(-1).long().cpu()
        self.parents = self.parents.reshape(-1).long().cpu()
        if self.tokens.numel() != self.parents.numel():
            raise ValueError("tokens and parents differ in length")
        par = self.parents.tolist()
        if par[0] != -1 or any(not (0 <= p < i) for i, p in enumerate(par) if i):
            raise ValueError(f"parents must satisfy parents[0] == -1 and 0 <= parents[i] < i: {par}")
        if self.side is not None and self.side.mask.shape[1] != len(par) + self.side.size:
            raise ValueError(f"side rows' mask has {self.side.mask.shape[1]} columns, not root + "
                             f"{len(par) - 1} nodes + {self.side.size} side rows")

    @classmethod
    def chain(cls, root: int, drafts: list[int] | torch.Tensor) -> "DraftTree":
        """A single path root -> drafts[0] -> drafts[1] ..."""
        drafts = torch.as_tensor(drafts, dtype=torch.long).reshape(-1)
        n = drafts.numel()
        tokens = torch.cat([torch.tensor([root]), drafts])
        parents = torch.arange(-1, n, dtype=torch.long)
        return cls(tokens, parents)

    @classmethod
    def root_only(cls, root: int) -> "DraftTree":
        return cls(torch.tensor([root]), torch.tensor([-1]))

    @property
    def size(self) -> int:
        """Number of draft nodes (root excluded)."""
        return self.tokens.numel() - 1

    @property
    def width(self) -> int:
        """Rows of the verify forward: the root, the draft nodes and any side rows."""
        return self.tokens.numel() + (self.side.size if self.side is not None else 0)

    @cached_property
    def parent_list(self) -> list[int]:
        return self.parents.tolist()

    @cached_property
    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parent_list]
        for i, p in enumerate(self.parent_list[1:], start=1):
            kids[p].append(i)
        return kids

    def verify_children(self, node: int, borrowed: bool = False) -> list[int]:
        """Children the acceptance rule tries under `node`: the real ones, then any extra ones; on a
        borrowed continuation (`borrowed`: the walk took an extra edge) only its `borrowed_next`."""
        if borrowed:
            nxt = self.borrowed_next.get(node)
            return [] if nxt is None else [nxt]
        extra = self.extra_children.get(node)
        return self.children[node] + extra if extra else self.children[node]

    def borrows(self, node: int, child: int) -> bool:
        """Whether the walk from `node` to `child` takes an extra (borrowed) edge."""
        return bool(self.extra_children) and child not in self.children[node]

    @cached_property
    def depths(self) -> torch.Tensor:
        """Depth of each node (root 0); used as position offsets."""
        d = [0] * len(self.parent_list)
        for i, p in enumerate(self.parent_list[1:], start=1):
            d[i] = d[p] + 1
        return torch.tensor(d, dtype=torch.long)

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """[N+1, N+1] bool; mask[q, k] = True iff k is q or an ancestor of q (lower-triangular)."""
        n = len(self.parent_list)
        m = torch.zeros(n, n, dtype=torch.bool)
        m[0, 0] = True
        for i, p in enumerate(self.parent_list[1:], start=1):
            m[i] = m[p]
            m[i, i] = True
        return m

    @cached_property
    def attention_mask(self) -> torch.Tensor:
        """The mask the target uses: ancestors plus any `extra_mask` edges."""
        m = self.ancestor_mask
        if self.extra_mask:
            m = m.clone()
            for qi, ki in self.extra_mask:
                m[qi, ki] = True
        return m

    def verify_inputs(self, device: torch.device, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the target's verify forward takes, on `device` (the target's input device): tokens
        [N+1], position ids `start + depth` [N+1] and the attention mask [N+1, N+1] (bool). Made
        from the host parent list (microseconds of Python for the 129 nodes a tree may have) and
        written to the device in two copies, never built row by row there (a kernel per row).
        With side rows: tokens and positions [N+1+S], the mask [N+1+S, N+1+S] (tree rows as
        without them, side rows as their mask says)."""
        if self.side is not None:
            return self._with_side_rows(device, start)
        ids = torch.stack((self.tokens, self.depths + start)).to(device)
        return ids[0], ids[1], self.attention_mask.to(device)

    def _with_side_rows(self, device: torch.device, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, side = self.tokens.numel(), self.side
        ids = torch.stack((torch.cat((self.tokens, side.tokens)),
                           torch.cat((self.depths, side.offsets)) + start)).to(device)
        mask = torch.zeros(n + side.size, n + side.size, dtype=torch.bool)
        mask[:n, :n] = self.attention_mask
        mask[n:] = side.mask
        return ids[0], ids[1], mask.to(device)

    def paths(self) -> list[list[int]]:
        """Every root->leaf path as node indices (the rows of `retrieve_indices`)."""
        out = []
        for i, kids in enumerate(self.children):
            if not kids:
                path = [i]
                while self.parent_list[path[-1]] >= 0:
                    path.append(self.parent_list[path[-1]])
                out.append(path[::-1])
        return out

    def retrieve_indices(self) -> torch.Tensor:
        """[leaves, max_depth+1] node indices per root->leaf path, padded with -1."""
        paths = self.paths()
        width = max(len(p) for p in paths)
        return torch.tensor([p + [-1] * (width - len(p)) for p in paths], dtype=torch.long)


def tree_from_parent_map(root: int, tokens: list[int], parents: list[int]) -> DraftTree:
    """Build a tree from draft tokens whose parents index into [root] + tokens (0 = root)."""
    return DraftTree(torch.tensor([root] + list(tokens)), torch.tensor([-1] + list(parents)))


# Medusa's static tree of 63 draft nodes (FasterDecoding/Medusa, medusa_choices.py), also Hydra's
# default. Each entry is the path of ranks [i0, i1, ...]: rank i_d among the depth-(d+1) head's
# top-k. The list is ordered by estimated acceptance, so its first N entries are the best N-node
# tree that the list knows (every prefix's parent comes earlier): the CPU presets take those.
MC_SIM_7B_63 = [
    [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
    [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8], [9],
    [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0], [0, 1, 1],
    [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0], [1, 4], [7, 0],
    [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1], [9, 0], [0, 6, 0],
    [0, 0, 0, 1], [1, 6], [0, 7, 0],
]
TREE_PRESETS = {"mc_sim_7b_63": MC_SIM_7B_63, "cpu_31": MC_SIM_7B_63[:31], "cpu_15": MC_SIM_7B_63[:15],
                "cpu_7": MC_SIM_7B_63[:7]}


@dataclass
class StaticTree:
    """A static tree from "choices": nodes in topological order (by depth, then list order).
    parents index into [root] + nodes; ranks[i] is node i's rank in its depth's top-k."""

    choices: list[list[int]]

    def __post_init__(self) -> None:
        known = {tuple(c) for c in self.choices}
        for c in self.choices:
            if len(c) > 1 and tuple(c[:-1]) not in known:
                raise ValueError(f"tree choice {c} has no parent {c[:-1]} in the list")
        self.nodes = sorted((list(c) for c in self.choices), key=lambda c: (len(c), c))
        index = {tuple(c): i + 1 for i, c in enumerate(self.nodes)}
        self.parents = [index[tuple(c[:-1])] if len(c) > 1 else 0 for c in self.nodes]
        self.depths = [len(c) for c in self.nodes]
        self.ranks = [c[-1] for c in self.nodes]
        self.max_depth = max(self.depths, default=0)
        self.topk = max(self.ranks, default=-1) + 1
        # node id (0 = root) -> ids of its children; drafters walk this every step
        self.children: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            self.children.setdefault(p, []).append(i + 1)

    @classmethod
    def named(cls, name_or_choices) -> "StaticTree":
        if isinstance(name_or_choices, str):
            if name_or_choices not in TREE_PRESETS:
                from harness.core.errors import unknown

                raise unknown("tree preset", name_or_choices, TREE_PRESETS)
            return cls(TREE_PRESETS[name_or_choices])
        return cls([list(c) for c in name_or_choices])

    @classmethod
    def for_heads(cls, name_or_choices, heads: int) -> "StaticTree":
        """The named tree, cut to the depth that `heads` draft heads can fill."""
        tree = cls.named(name_or_choices)
        return tree.truncated(heads) if tree.max_depth > heads else tree

    def truncated(self, max_depth: int) -> "StaticTree":
        return StaticTree([c for c in self.choices if len(c) <= max_depth])

    def first(self, n: int) -> "StaticTree":
        """The tree of its first `n` choices where they hold every parent (the presets and fitted
        candidates are listed best first), else of its first `n` nodes by depth."""
        head = [list(c) for c in self.choices[:n]]
        known = {tuple(c) for c in head}
        closed = all(len(c) == 1 or tuple(c[:-1]) in known for c in head)
        return StaticTree(head if closed else self.nodes[:n])
