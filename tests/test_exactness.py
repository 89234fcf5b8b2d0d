"""Greedy speculative decoding must reproduce AR greedy token for token (float32), and every
path to an answer (one `run`, one temperature of a grid, the loop's trimming) gives the same one."""
from __future__ import annotations

import io
import json

import pytest
import torch

from harness.core.decode import Answer, GenerationConfig, generate
from harness.testing.oracle import OracleDrafter
from methods.pld import PromptLookupDrafter


def prompts(vocab: int, n: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(n):
        seg = torch.randint(0, vocab, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()
        # A repeated segment gives prompt lookup something to find, as real prompts do.
        out.append(seg + seg[: len(seg) // 2] + seg)
    return out


def accepted_share(gens) -> float:
    steps = [a for g in gens for a in g.accepted]
    return sum(a > 0 for a in steps) / len(steps)


@pytest.mark.parametrize("method", ["oracle", "pld"])
def test_greedy_equals_ar_on_tiny_llama(device_target, method):
    tiny_target = device_target  # on the test device (tests/conftest.py: --device)
    cfg = GenerationConfig(max_new_tokens=48)
    gens = []
    for i, p in enumerate(prompts(tiny_target.vocab_size)):
        ar = generate(tiny_target, p, cfg)
        if method == "oracle":
            d = OracleDrafter(tiny_target, {"continuation": ar.output_ids, "prompt_len": len(p), "seed": i})
        else:
            # our variant: a short continuation is proposed too, so most steps exercise the commit
            d = PromptLookupDrafter(tiny_target, {"adaptive": True, "match": "latest"})
        sp = generate(tiny_target, p, cfg, d)
        assert sp.output_ids == ar.output_ids, f"prompt {i}: {method} diverged from AR"
        assert sum(sp.tokens) + 1 == len(sp.output_ids)  # prefill token + step tokens
        gens.append(sp)
    assert accepted_share(gens) >= 0.30, f"{method}: too few steps accepted a draft to exercise the commit"


class _Decoding:
    """A stand-in target for trimming: token t decodes to the text of t."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(96 + t) for t in ids)


@pytest.mark.parametrize("new,limit,stops,kept,ids,reason", [
    ([3, 4, 5], 10, (), [3, 4, 5], [1, 3, 4, 5], "length"),
    ([3, 9, 5], 10, (), [3, 9], [1, 3, 9], "eos"),               # cut after the first EOS
    ([3, 4, 5], 3, (), [3, 4], [1, 3, 4], "length"),             # cut at the token limit
    ([3, 4, 5], 10, ("cd",), [3, 4], [1, 3, 4], "stop"),         # cut at the end of the stop string
    ([3, 9, 5], 10, ("ci",), [3, 9], [1, 3, 9], "stop"),         # a stop string outranks EOS
    ([2, 4, 5], 10, ("ab",), [2], [1, 2], "stop"),               # spanning the previous step's tokens
])
def test_answer_trims_at_eos_limit_and_stop_strings(new, limit, stops, kept, ids, reason):
    cfg = GenerationConfig(limit, stop_strings=stops)
    answer = Answer(_Decoding(), cfg, {9}, [1], [7, 7, 1])
    context = answer.context
    assert answer.extend(new) == kept
    assert (answer.ids, answer.stop_reason) == (ids, reason)
    assert answer.context is context and context == [7, 7, *ids]  # drafters keep one list per answer


def _timeless(rec: dict) -> dict:
    steps = {k: v for k, v in rec["steps"].items() if not k.endswith("_ms")}
    clocks = ("wall_s", "prefill_s", "other_cpu_cores")
    return {**{k: v for k, v in rec.items() if k not in clocks}, "steps": steps}


def test_a_grid_builds_each_drafter_once_and_answers_as_single_runs(shared_data, tmp_path, monkeypatch):
    """The temperatures of a grid share one drafter per method (its state is per sequence, reset
    by `begin`), and each temperature's answers equal those of a `run` at that temperature alone."""
    from rich.console import Console

    from harness.core import machine_meta
    from harness.runs.config import RunConfig
    from harness.runs.executor import run_grid
    from harness.runs.results import RunDir
    from methods.pld import PromptLookupDrafter
    from tests.conftest import make_tiny_target

    target = make_tiny_target()
    target.encode_chat = lambda messages: [b % 90 + 1 for m in messages for b in m["content"].encode()][:40]
    target.decode = lambda ids: " ".join(map(str, ids))
    quiet = Console(file=io.StringIO())
    built = []
    create = PromptLookupDrafter.create.__func__
    monkeypatch.setattr(PromptLookupDrafter, "create",
                        classmethod(lambda cls, *a, **k: built.append(cls) or create(cls, *a, **k)))
    # other processes "use" a known 0.25 cores during every answer, which each record must carry
    monkeypatch.setattr(machine_meta.OtherCpuUse, "__exit__", lambda self, *exc: setattr(self, "cores", 0.25))
    spec = RunConfig(methods=["pld"], benchmarks=["mt_bench"], temperatures=[0.0, 1.0], target="tiny", limit=2,
                     max_new_tokens=12, dtype="float32")
    grid = {r["key"]: r for r in RunDir(run_grid(spec, tmp_path / "grid", shared_data, quiet, target,
                                                 command="compare")).records()}
    assert len(built) == 1 and len(grid) == 2 * 2 * 2 * 2  # temperatures x questions x turns x (ar, pld)
    meta = json.loads((tmp_path / "grid" / "meta.json").read_text())
    assert meta["config"]["temperatures"] == [0.0, 1.0] and "pld" in meta["config"]["methods_resolved"]
    for t in spec.temperatures:
        out = run_grid(spec.at(t), tmp_path / f"t{t}", shared_data, quiet, target)
        alone = RunDir(out).records()
        assert len(alone) == 2 * 2 * 2
        assert [r["other_cpu_cores"] for r in alone] == [0.25] * len(alone)  # what else ran meanwhile
        assert all(_timeless(r) == _timeless(grid[r["key"]]) for r in alone), f"T={t}: the grid answered otherwise"
    assert json.loads((tmp_path / "t0.0" / "meta.json").read_text())["config"]["temperature"] == 0.0
