"""Hydra: teacher-loss offsets, exactness after brief training; the trainer resumes exactly."""
from __future__ import annotations

import json

import pytest
import torch

from harness.core.errors import SpecbenchError
from harness.train.data import DistillBatch
from methods.common.losses import frozen_head_ce
from harness.train.trainer import TrainConfig, Trainer
from methods.hydra import Hydra
from methods.medusa import Medusa
from tests.train_helpers import assert_greedy_exact, tiny_dataset, train_quickly


@pytest.fixture(scope="module")
def tiny_data(tiny_target):
    return tiny_dataset(tiny_target)


def test_frozen_head_ce_matches_autograd():
    torch.manual_seed(0)
    w = torch.randn(50, 8)
    pred = torch.randn(13, 8, requires_grad=True)
    teacher = torch.randn(13, 8)
    mask = (torch.rand(13) > 0.3).float()
    loss, _ = frozen_head_ce(pred, w, mask, target_hidden=teacher, chunk=4)
    loss.backward()
    ref_pred = pred.detach().clone().requires_grad_(True)
    per = -((teacher @ w.T).softmax(-1) * (ref_pred @ w.T).log_softmax(-1)).sum(-1)
    ref = (per * mask).sum() / mask.sum()
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(pred.grad, ref_pred.grad, atol=1e-5)


@pytest.mark.parametrize("chunk", [3, None])
def test_frozen_head_ce_hard_labels_skip_masked_rows(chunk):
    """Hard labels, fractional weights, masked rows (only rows with weight are projected): loss,
    gradient and top-1 agreement as autograd computes them over all rows."""
    torch.manual_seed(1)
    w = torch.randn(40, 8)
    pred = torch.randn(11, 8, requires_grad=True)
    labels = torch.randint(0, 40, (11,))
    mask = torch.tensor([1, 0, 0.5, 1, 1, 0, 0, 1, 2, 0, 1.0])
    loss, acc = frozen_head_ce(pred, w, mask, labels=labels, chunk=chunk)
    loss.backward()
    ref_pred = pred.detach().clone().requires_grad_(True)
    logq = (ref_pred @ w.T).log_softmax(-1)
    ref = -(logq.gather(-1, labels[:, None]).squeeze(-1) * mask).sum() / mask.sum()
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(pred.grad, ref_pred.grad, atol=1e-5)
    assert pred.grad[mask == 0].abs().max() == 0
    hits = (logq.argmax(-1) == labels).float()
    assert torch.allclose(acc, (hits * mask).sum() / mask.sum())


def test_hydra_loss_offsets(tiny_target):
    d = Hydra(tiny_target, {"heads": 2, "layers": 1, "dropout": 0.0})
    T, H = 7, tiny_target.hidden_size
    feats = torch.randn(1, T, H)
    ids = torch.arange(T)[None] + 5
    out = d.loss(DistillBatch(ids, feats, feats, torch.ones(1, T), torch.ones(1, T)))
    z = d.prefix(feats, torch.arange(T)[None])
    emb = tiny_target.embed(ids)
    ref = 0.0
    for i in range(2):
        n = T - 2 - i
        # head i at t sees [z_t, emb(x_{t+1}) .. emb(x_{t+i+1})] and is scored against lm_head(f_{t+i+1})
        x = torch.cat([z[0, :n]] + [emb[0, 1 + j : 1 + j + n] for j in range(i + 1)], -1)
        logq = tiny_target.project(d.hydra_head[i](x)).log_softmax(-1)
        p = tiny_target.project(feats[0, i + 1 : i + 1 + n]).softmax(-1)
        ref += (-(p * logq).sum(-1)).mean()
    assert torch.allclose(out["loss"], ref, atol=1e-4)


def test_greedy_hydra_equals_ar_after_brief_training(tiny_target, tiny_data, tmp_path):
    d = Hydra(tiny_target, {"heads": 3, "layers": 2})
    train_quickly(d, tiny_data, tmp_path / "hydra", steps=150)
    d.save_pretrained(tmp_path / "ck")
    d = Hydra.from_pretrained(tmp_path / "ck", tiny_target)
    assert_greedy_exact(tiny_target, d, seed=98)


def test_interrupted_training_resumes_exactly(tiny_target, tiny_data, tmp_path, monkeypatch):
    def cfg():
        return TrainConfig(steps=12, lr=3e-3, warmup=2, tokens_per_batch=512, max_len=64, save_every=4,
                           eval_every=100, autocast="off")

    torch.manual_seed(1)
    ref = Medusa(tiny_target, {"heads": 2})
    Trainer(ref, tiny_data, cfg(), tmp_path / "ref").train()

    torch.manual_seed(1)
    d = Medusa(tiny_target, {"heads": 2})
    real = Medusa.loss
    calls = {"n": 0}

    def interrupting(self, batch):
        calls["n"] += 1
        if calls["n"] == 7:  # Ctrl-C during step 7
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(Medusa, "loss", interrupting)
    with pytest.raises(KeyboardInterrupt):
        Trainer(d, tiny_data, cfg(), tmp_path / "run").train()
    monkeypatch.setattr(Medusa, "loss", real)
    log = tmp_path / "run" / "train_log.jsonl"
    with log.open("a") as f:  # what a kill -9 after step 7 leaves: a logged step past the checkpoint
        f.write(json.dumps({"step": 7, "loss": 1.0}) + "\n")
    torch.manual_seed(999)  # a fresh process: the RNG must come from the checkpoint
    d2 = Medusa(tiny_target, {"heads": 2})
    t2 = Trainer(d2, tiny_data, cfg(), tmp_path / "run")
    assert t2.try_resume() and t2.step == 6
    t2.train()
    for (k, a), b in zip(ref.state_dict().items(), d2.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    # each step is logged once: the killed run's step 7 row gave way to the resumed run's
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == list(range(1, 13))
    # the weight file says where each session ran: the first from step 0, the resumed one from 6
    sessions = json.loads((tmp_path / "run" / "config.json").read_text())["training"]["trained_on"]
    assert [s["from_step"] for s in sessions] == [0, 6]
    assert all(s["cpu_kind"] and s["torch"] == torch.__version__ for s in sessions)


def test_warm_start_loads_the_checkpoint_and_counts_its_steps(tiny_target, tiny_data, tmp_path):
    from safetensors.torch import load_file

    from harness.train.pipeline import warm_start

    cfg = TrainConfig(steps=4, lr=3e-3, warmup=1, tokens_per_batch=512, max_len=64, eval_every=100, autocast="off")
    torch.manual_seed(2)
    Trainer(Medusa(tiny_target, {"heads": 2}), tiny_data, cfg, tmp_path / "stage1").train()

    torch.manual_seed(3)
    d = Medusa(tiny_target, {"heads": 2})
    prior = warm_start(d, tmp_path / "stage1", d.config)
    # recorded without the machine's layout: relative inside the checkout, the last two parts outside it
    assert prior["steps"] == 4 and prior["path"] == f"<outside the repository>/{tmp_path.name}/stage1" and prior["epochs"] >= 1
    saved = load_file(str(tmp_path / "stage1" / "model.safetensors"))
    for k, v in saved.items():
        assert torch.equal(d.state_dict()[k], v.to(d.state_dict()[k].dtype)), k
    stage2 = Trainer(d, tiny_data, cfg, tmp_path / "stage2", prior=prior)
    summary = stage2.train()
    assert summary["steps"] == 4 and summary["total_steps"] == 8 and summary["init_from"]["steps"] == 4
    assert summary["total_epochs"] == prior["epochs"] + summary["epochs"]
    # epoch-scheduled loss terms (Gumiho's MLP CE) see the checkpoint's passes as well
    assert d.train_epoch == stage2.epoch + prior["epochs"]

    with pytest.raises(SpecbenchError, match="same architecture"):
        warm_start(Medusa(tiny_target, {"heads": 3}), tmp_path / "stage1", Medusa.resolve_config({"heads": 3}))
    with pytest.raises(SpecbenchError, match="no config.json"):
        warm_start(d, tmp_path / "nowhere", d.config)
    with pytest.raises(SpecbenchError, match="holds 'medusa' weights, not 'hydra'"):
        warm_start(Hydra(tiny_target, {"heads": 2, "layers": 1}), tmp_path / "stage1", {})


def test_loaded_drafters_decode_in_eval_mode(tiny_target, tmp_path):
    """Hydra's heads have dropout: a drafter loaded for a run must be in eval mode, or its drafts
    (and so τ, never the output) would depend on the RNG state."""
    d = Hydra(tiny_target, {"heads": 2, "layers": 2, "dropout": 0.5})
    d.save_pretrained(tmp_path / "ck")
    loaded = Hydra.create(tiny_target, {"dropout": 0.5}, str(tmp_path / "ck"))
    assert not any(m.training for m in loaded.modules())
    x = torch.randn(3, tiny_target.hidden_size * 3)
    torch.manual_seed(1)
    a = loaded.hydra_head[1](x)
    torch.manual_seed(2)
    assert torch.equal(a, loaded.hydra_head[1](x))
    assert not torch.equal(a, d.train().hydra_head[1](x))  # the control: dropout on changes it
