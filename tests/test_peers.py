"""The peer runner (harness/peers/): the catalog, the worker's shims and step counter, and the whole
plumbing — ours and a fake official implementation on the same prompts into one run folder — on
the tiny target, with the current interpreter standing in for the peer's environment. The tests
that run the real peers need ../shared/peers and their environments and skip without them."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.peers import catalog, worker
from harness.peers.catalog import PEERS, SHIM_NOTES, Peer
from harness.peers.runner import run_peers, trim
from harness.runs.config import RunConfig
from harness.runs.results import RunDir
from methods.registry import get_method
from tests.test_grid_rules import _target

QUIET = Console(file=io.StringIO())
SETUP = "bash scripts/setup_peers.sh"


# ----------------------------------------------------------------------------- the catalog
@pytest.mark.parametrize("name", sorted(PEERS))
def test_every_peer_names_what_the_worker_and_our_method_know(name):
    peer = PEERS[name]
    assert peer.adapter in worker.ADAPTERS and peer.ar_adapter in worker.ADAPTERS
    assert set(peer.shims) <= set(worker.SHIMS) & set(SHIM_NOTES)
    get_method(peer.method).resolve_config(dict(peer.ours))  # our config with the peer's settings is valid
    if peer.layout:
        assert get_method(peer.layout).trainable


# ----------------------------------------------------------------------------- the worker's parts
def fake_module(tmp_path: Path, monkeypatch, name: str, source: str) -> types.ModuleType:
    """An importable module `name` of `source` in a temporary folder (a stand-in for a peer's file)."""
    folder = tmp_path / "fake_peer_modules"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    import importlib

    return importlib.import_module(name)


ROTARY = """
    import torch

    class Rotary(torch.nn.Module):
        def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
            super().__init__()
            self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, base
            self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    class Attention(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self._init_rope()

        def _init_rope(self):  # as the peers' copies: the base never read from the config
            self.rotary_emb = Rotary(8, max_position_embeddings=64)
"""


def test_rope_shim_gives_the_attention_the_configs_base(tmp_path, monkeypatch):
    module = fake_module(tmp_path, monkeypatch, "fake_rope_peer", ROTARY)
    config = types.SimpleNamespace(rope_theta=100000.0, rope_scaling=None)
    assert module.Attention(config).rotary_emb.base == 10000  # the bug the shim is for
    worker.rope_theta_shim(["fake_rope_peer"], {})
    rotary = module.Attention(config).rotary_emb
    assert rotary.base == 100000.0 and rotary.max_position_embeddings == 64
    assert torch.allclose(rotary.inv_freq, 1.0 / 100000.0 ** (torch.arange(0, 8, 2).float() / 8))
    scaled = types.SimpleNamespace(rope_theta=100000.0, rope_scaling={"type": "linear", "factor": 2.0})
    assert module.Attention(scaled).rotary_emb.base == 10000  # scaling is the peer's own business


KV_CACHE = """
    import torch

    def initialize_past_key_values(model):
        c = model.config
        return torch.zeros(c.num_hidden_layers * 2, 1, c.num_attention_heads, c.max_position_embeddings,
                           c.hidden_size // c.num_attention_heads, dtype=model.dtype)
"""


def test_kv_heads_shim_sizes_the_cache_by_key_value_heads(tmp_path, monkeypatch):
    module = fake_module(tmp_path, monkeypatch, "fake_kv_peer", KV_CACHE)
    config = types.SimpleNamespace(num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3,
                                   max_position_embeddings=16, hidden_size=576)
    model = types.SimpleNamespace(config=config, device=torch.device("cpu"), dtype=torch.float32)
    assert module.initialize_past_key_values(model).shape == (4, 1, 9, 16, 64)  # query heads: the bug
    worker.kv_heads_shim(["fake_kv_peer"], {})
    assert module.initialize_past_key_values(model).shape == (4, 1, 3, 16, 64)
    assert config.num_attention_heads == 9  # the model's own config is left as it is


LOOP = """
    import torch

    def update_inference_inputs(input_ids, accepted):
        return torch.cat([input_ids, torch.arange(accepted)[None] + 100], dim=1), None

    def generate(input_ids, steps):
        for a in steps:
            input_ids, _ = update_inference_inputs(input_ids, a)
            yield input_ids
"""


def test_step_counter_reads_each_step_of_a_loop_that_does_not_return_them(tmp_path, monkeypatch):
    module = fake_module(tmp_path, monkeypatch, "fake_loop_peer", LOOP)
    counter = worker.StepCounter(module)
    counter.run_stream(module.generate(torch.tensor([[1, 2]]), [3, 1, 4, 2, 5]), max_new_tokens=8)
    assert counter.steps == [3, 1, 4]  # stopped once the limit was reached
    assert counter.ids.tolist() == [[1, 2, 100, 101, 102, 100, 100, 101, 102, 103]]
    counter.reset()
    list(module.generate(torch.tensor([[1]]), [2]))
    assert counter.steps == [2]


def test_trim_counts_a_peer_answer_as_ours():
    # EAGLE-style: each step is root + accepted drafts; cut at the limit
    assert trim([5, 6, 7, 8, 9, 10], [2, 3, 1], 5, set(), False) == ([5, 6, 7, 8, 9], [2, 2])
    # transformers-style: the first step also held the prefill's token
    assert trim([5, 6, 7, 8], [3, 1], 8, set(), True) == ([5, 6, 7, 8], [2, 1])
    # an EOS ends the answer (kept) and the steps after it
    assert trim([5, 2, 7, 8], [1, 3], 8, {2}, False) == ([5, 2], [1])


# ----------------------------------------------------------------------------- the plumbing, with a fake peer
FAKE_LOOP = """
    from pathlib import Path

    import torch

    from harness.core.tiny_target import tiny_llama


    def greedy(model, ids, n):
        seq = list(ids)
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        return seq[len(ids):]


    def build(job):
        from fakepeer.attention import Attention

        if Attention({"rope_theta": 100000.0}).base != 100000.0:
            raise RuntimeError("the rope_theta shim was not applied")
        if job["settings"].get("touch"):
            (Path(__file__).parent / "written-by-the-run").write_text("a peer must not be edited")
        model, step = tiny_llama(), job["settings"]["step"]

        def generate(ids, max_new_tokens, temperature):
            out = greedy(model, ids, max_new_tokens + 3)  # past the limit, as the peers' loops run
            return out, [step] * (len(out) // step) + ([len(out) % step] if len(out) % step else [])
        return generate


    def build_ar(job):
        model = tiny_llama()
        return lambda ids, n, t: (greedy(model, ids, n), [1] * n)


    build_ar.prefill_step = True
"""
FAKE_ATTENTION = """
    import types

    import torch


    class Rotary:
        def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
            self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, base
            self.inv_freq = torch.ones(dim // 2)


    class Attention:  # as the peers' copies: the RoPE base never read from the config
        def __init__(self, config):
            self.config = types.SimpleNamespace(**config)
            self._init_rope()

        def _init_rope(self):
            self.rotary_emb = Rotary(8)

        @property
        def base(self):
            return self.rotary_emb.base
"""


@pytest.fixture
def fake_peer(tmp_path, monkeypatch):
    """A peer folder `fake/` under a peer root, whose package brings its own adapters, a catalog
    entry for it (our pld with its settings), and an "environment" that is this interpreter."""
    root = tmp_path / "peers"
    package = root / "fake" / "fakepeer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "loop.py").write_text(textwrap.dedent(FAKE_LOOP))
    (package / "attention.py").write_text(textwrap.dedent(FAKE_ATTENTION))
    (root / "README.md").write_text("| folder | source | commit |\n|---|---|---|\n| `fake/` | a test | abc1234 (2026-01-01) |\n")
    venv = tmp_path / "venvs" / "transformers-fake" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PEER_VENVS", str(tmp_path / "venvs"))
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("harness.peers.runner.base_view", lambda spec, work: tmp_path / "base")

    def add(name: str, **settings) -> Peer:
        peer = Peer(name, "pld", f"Fake ({name})", "fake", "fake", "fakepeer.loop:build", "fakepeer.loop:build_ar",
                    settings={"step": 2, **settings}, ours={"max_draft": 3},
                    shims={"rope_theta": ("fakepeer.attention",)})
        monkeypatch.setitem(catalog.PEERS, name, peer)
        return peer

    return root, add


def peers_cfg(benchmarks: tuple[str, ...] = ("mt_bench",)) -> RunConfig:
    return RunConfig(methods=[], benchmarks=list(benchmarks), temperatures=[0.0], target="tiny", limit=1,
                     max_new_tokens=8, dtype="float32")


@pytest.mark.slow
def test_a_peer_runs_beside_ours_on_the_same_prompts_and_resumes(fake_peer, shared_data, tmp_path, monkeypatch):
    from harness.report.run_readme import write_report

    root, add = fake_peer
    peer = add("fake/pld")
    out = run_peers([peer.name], peers_cfg(), tmp_path / "run", shared_data, root, QUIET, target=_target())
    recs = RunDir(out).records()
    theirs = [r for r in recs if r.get("implementation") == "fake@abc1234" and r["method"] == "pld"]
    their_ar = [r for r in recs if r.get("implementation") == "fake@abc1234" and r["method"] == "ar"]
    ours_ar = {(r["benchmark"], r["turn"]): r for r in recs if r["method"] == "ar" and not r.get("implementation")}
    assert len(theirs) == len(their_ar) == 2  # MT-Bench's two turns
    for rec in theirs:
        assert rec["new_tokens"] == 8 and len(rec["output_ids"]) == 8  # cut at the limit
        assert rec["steps"]["tokens"] == [2, 2, 2, 1]  # the last step cut to what was kept
    # turn 1 is on our prompt ids: the fake decodes the tiny target greedily, as our AR does
    assert {(r["benchmark"], r["turn"]): r["output_ids"] for r in theirs if r["turn"] == 0} == \
        {k: r["output_ids"] for k, r in ours_ar.items() if k[1] == 0}
    # turn 2 is templated by us from the peer's own turn-1 answer
    jobs = sorted((tmp_path / "cache" / "peers" / "tiny-llama" / "jobs").glob("*-turn1.json"))
    target, turn1 = _target(), next(r for r in theirs if r["benchmark"] == "mt_bench" and r["turn"] == 0)
    from harness.runs.benchmarks import load_questions

    q = load_questions("mt_bench", shared_data, 1)[0]
    expected = target.encode_chat([{"role": "user", "content": q.turns[0]},
                                   {"role": "assistant", "content": target.decode(turn1["output_ids"]).strip()},
                                   {"role": "user", "content": q.turns[1]}])
    prompts = [p for job in jobs for p in json.loads(job.read_text())["prompts"]]
    assert expected in [p["ids"] for p in prompts]
    meta = json.loads((out / "meta.json").read_text())
    entry = meta["peers"][peer.label]
    assert entry["commit"] == "abc1234" and entry["settings"] == {"step": 2}
    assert entry["shims"]["rope_theta"]["modules"] == ["fakepeer.attention"]
    assert str(tmp_path) not in (out / "meta.json").read_text() + (out / "records.jsonl").read_text()
    write_report(out)
    table = (out / "tables" / "peers.md").read_text()
    assert peer.label in table and "/2 |" in table
    answers = (out / "tables" / "peers-answers.csv").read_text().splitlines()
    assert len(answers) == 1 + 2
    # a second run resumes: no peer started again, nothing appended
    before = (out / "records.jsonl").read_text()
    raw = {p.name: p.read_text() for p in (out / "peer-answers").iterdir()}
    python = tmp_path / "venvs" / "transformers-fake" / "bin" / "python"
    python.unlink()
    python.write_text("#!/bin/sh\nexit 3\n")  # a worker started now would fail the run
    python.chmod(0o755)
    run_peers([peer.name], peers_cfg(), out, shared_data, root, QUIET, target=_target())
    assert (out / "records.jsonl").read_text() == before
    assert {p.name: p.read_text() for p in (out / "peer-answers").iterdir()} == raw


def test_a_peer_that_edits_its_own_folder_fails_the_run(fake_peer, shared_data, tmp_path):
    root, add = fake_peer
    peer = add("fake/touch", touch=True)
    with pytest.raises(SpecbenchError, match="changed during the run"):
        run_peers([peer.name], peers_cfg(("gsm8k",)), tmp_path / "run", shared_data, root, QUIET, ours=False,
                  target=_target())


def test_a_missing_environment_names_the_setup_command(fake_peer, shared_data, tmp_path, monkeypatch):
    root, add = fake_peer
    peer = add("fake/nowhere")
    monkeypatch.setenv("PEER_VENVS", str(tmp_path / "no-venvs"))
    with pytest.raises(SpecbenchError, match=SETUP):
        run_peers([peer.name], peers_cfg(), tmp_path / "run", shared_data, root, QUIET, target=_target())


# ----------------------------------------------------------------------------- the training-free peers
DEVICE_PEER = """
    import torch

    def buffers(n):
        return torch.zeros(n, dtype=torch.long, device=torch.device('cuda:0')), torch.ones(n).sum()
"""


def test_cuda_device_shim_builds_a_peers_cuda_tensors_on_the_cpu(tmp_path, monkeypatch):
    module = fake_module(tmp_path, monkeypatch, "fake_device_peer", DEVICE_PEER)
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):  # what Spec-Bench's recycling runner does on a CPU
            module.buffers(3)
    worker.cuda_device_shim(["fake_device_peer"], {})
    ids, total = module.buffers(3)
    assert ids.device.type == "cpu" and ids.tolist() == [0, 0, 0] and total.item() == 3.0
    assert module.torch.long is torch.long  # every other name is torch's own


class FakeRetriever(types.ModuleType):
    """draftretriever's Writer as PyPI's 0.1.1 has it (`file_path`), recording its entries."""

    def __init__(self) -> None:
        super().__init__("draftretriever")
        self.entries: list[list[int]] = []
        fake = self

        class Writer:
            def __init__(self, file_path, vocab_size=None):
                self.path, fake.vocab = file_path, vocab_size

            def add_entry(self, py_text):
                fake.entries.append(list(py_text))

            def finalize(self):
                Path(self.path).write_text("index")
        self.Writer = Writer


def test_rest_peer_index_holds_one_entry_per_document_of_our_datastore(tmp_path, monkeypatch):
    import numpy as np

    fake = FakeRetriever()
    monkeypatch.setitem(sys.modules, "draftretriever", fake)
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.array([5, 6, 7, -1, 8, -1, 9, 10], dtype=np.int32))
    index = tmp_path / "idx" / "rest.idx"
    assert worker.retriever_index(str(tokens), str(index), 49152) == str(index)
    assert fake.entries == [[5, 6, 7], [8], [9, 10]] and fake.vocab == 49152 and index.read_text() == "index"
    assert worker.retriever_index(str(tokens), str(index), 49152) == str(index)  # written once
    assert len(fake.entries) == 3


def test_a_retrieval_peer_needs_our_datastore_and_other_peers_none(tmp_path, monkeypatch):
    from harness.peers.runner import peer_datastore

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    assert peer_datastore(PEERS["spec-bench/lookahead"], _target(), tmp_path) == {}
    with pytest.raises(SpecbenchError, match="datastore build"):
        peer_datastore(PEERS["spec-bench/rest"], _target(), tmp_path)


def test_new_tokens_reads_tensors_and_lists():
    assert worker.new_tokens(torch.tensor([[1, 2, 3, 4]]), 2) == [3, 4]
    assert worker.new_tokens([[1, 2, 3, 4]], 3) == [4]  # SAM-Decoding returns a list of lists


RECYCLING_RUNNER = """
    import torch

    def recycling_forward(inputs, model, tokenizer, max_new_tokens, output_id_topk=8, tree_version="2.2.2"):
        assert adj_matrix.shape == (model.vocab_size, output_id_topk) and not adj_matrix.any()  # a new zero matrix
        adj_matrix[0, 0] = 1  # what an answer leaves behind
        n = inputs.input_ids.shape[1]
        out = torch.cat([inputs.input_ids, torch.tensor([OUTPUTS.pop(0)])], dim=1)
        return out, out.shape[1] - n, 1, [1]
"""


def test_recycling_peer_starts_each_answer_anew_and_keeps_its_eos(tmp_path, monkeypatch):
    """The runner's loop stops on an EOS bonus without appending it: an answer short of the limit
    gets it back; a fresh adjacency matrix for every answer."""
    peer = tmp_path / "peer"
    (peer / "evaluation").mkdir(parents=True)
    (peer / "model" / "recycling").mkdir(parents=True)
    (peer / "evaluation" / "inference_recycling.py").write_text(textwrap.dedent(RECYCLING_RUNNER))
    (peer / "model" / "recycling" / "modeling_llama_kv.py").write_text(textwrap.dedent("""
        class LlamaForCausalLM:
            vocab_size = 11
            @classmethod
            def from_pretrained(cls, *a, **k):
                return cls()
            def eval(self):
                return self
    """))
    for pkg in ("evaluation", "model", "model.recycling", "evaluation.inference_recycling",
                "model.recycling.modeling_llama_kv"):
        monkeypatch.delitem(sys.modules, pkg, raising=False)
    monkeypatch.syspath_prepend(str(peer))
    monkeypatch.setattr(worker, "_tokenizer", lambda job: types.SimpleNamespace(eos_token_id=2))
    generate = worker.spec_bench_recycling({"base": "unused", "dtype": "float32", "settings": PEERS[
        "spec-bench/recycling"].settings})
    sys.modules["evaluation.inference_recycling"].OUTPUTS = [[7, 8], [7, 8, 9, 4]]
    assert generate([1, 2, 3], 4, 0.0) == ([7, 8, 2], [1])   # stopped short: its EOS bonus restored
    assert generate([1, 2, 3], 4, 0.0) == ([7, 8, 9, 4], [1])  # at the limit: nothing added


# ----------------------------------------------------------------------------- the real peers
PEER_ROOT = Path(os.environ.get("SPECBENCH_PEERS") or Path(__file__).resolve().parents[2] / "shared" / "peers")


def peer_env(version: str) -> Path:
    """The peer environment of `version`, or a skip naming the setup command."""
    from harness.peers.runner import peer_venvs

    python = peer_venvs() / f"transformers-{version}" / "bin" / "python"
    if not python.exists() or not PEER_ROOT.is_dir():
        pytest.skip(f"the peers ({PEER_ROOT}) or their environments ({python.parent.parent}) are absent: run `{SETUP}`")
    return python


@pytest.mark.smollm2
def test_spec_bench_medusas_base_model_leaves_the_target_without_the_shims(tmp_path):
    """Spec-Bench's Medusa base model (model/medusa/modeling_llama_kv.py) on SmolLM2: plain greedy
    decoding parts from the target's without the rope_theta shim and follows it with; its KV cache
    fails on the first write without the kv_heads shim and gives the target's token with."""
    from harness.peers.runner import base_view
    from harness.core.paths import REPO_ROOT

    python = peer_env("4.50.1")
    base = base_view("smollm2-135m", tmp_path)
    run = subprocess.run([str(python), "scripts/peer_base_model_check.py", "--peer-dir",
                          str(PEER_ROOT / "spec-bench-latest-transformer"), "--package", "model.medusa",
                          "--base", str(base)], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TRANSFORMERS_VERBOSITY": "error"})
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["peer_plain"] != got["target"]
    assert got["peer_rope_shimmed"] == got["target"]
    assert "must match" in got["kv_cache_error"] and got["kv_cache_error_shimmed"] is None
    assert got["kv_cache_first_token_shimmed"] == got["target"][0]
