"""A training that spans sessions commits its folder: only that folder, amending its own last
state commit, never failing the training when git is busy."""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness.train.state_commits import StateCommitter


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def make_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / ".gitignore").write_text("*.pt\n")   # as the project ignores trainer states elsewhere
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "start")
    return repo


def test_commits_only_its_folder_and_amends_its_own_last_commit(tmp_path):
    repo = make_repo(tmp_path)
    out = repo / "checkpoints" / "in-training" / "eagle"
    out.mkdir(parents=True)
    (out / "trainer_state.pt").write_bytes(b"state 1")
    (repo / "code.py").write_text("x = 2\n")
    git(repo, "add", "code.py")                       # someone else's staged change
    c = StateCommitter(out, every_s=3600, label="eagle eagle")
    assert c.maybe_commit(100) is None                # not due yet
    assert "committed" in c.maybe_commit(100, force=True)
    assert git(repo, "show", "--name-only", "--format=%s", "HEAD").split() [-1] == \
        "checkpoints/in-training/eagle/trainer_state.pt"          # ignored *.pt added on purpose
    assert "code.py" in git(repo, "diff", "--cached", "--name-only")  # still staged, not committed
    (out / "trainer_state.pt").write_bytes(b"state 2")
    said = c.maybe_commit(200, force=True)
    assert "amending" in said
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "2"  # start + one state commit
    assert git(repo, "show", "HEAD:checkpoints/in-training/eagle/trainer_state.pt") == "state 2"
    git(repo, "commit", "-qm", "other work")
    (out / "trainer_state.pt").write_bytes(b"state 3")
    assert "amending" not in c.maybe_commit(300, force=True)      # never rewrites someone else's commit
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "4"


def test_a_busy_or_missing_repository_never_stops_training(tmp_path):
    repo = make_repo(tmp_path)
    out = repo / "run"
    out.mkdir()
    (out / "w.bin").write_bytes(b"1")
    (repo / ".git" / "index.lock").write_text("")    # another git command holds the index
    said = StateCommitter(out, 0, "x").maybe_commit(1, force=True)
    assert said is not None and "not committed" in said
    (repo / ".git" / "index.lock").unlink()
    outside = tmp_path / "plain"
    outside.mkdir()
    assert "not inside a git checkout" in StateCommitter(outside, 0, "x").maybe_commit(1, force=True)


def test_a_training_cut_by_the_end_of_a_session_resumes_from_git_on_another_checkout(tiny_target, tmp_path,
                                                                                      monkeypatch):
    """The session ends mid-training (a stop signal: the trainer saves and commits); the next
    session starts on a new machine with only a clone of the repository; the resumed training
    ends with the weights of an uninterrupted run of the same seed."""
    import torch

    from harness.train.trainer import TrainConfig, Trainer
    from methods.medusa import Medusa
    from tests.train_helpers import tiny_dataset

    data = tiny_dataset(tiny_target, n=24, new_tokens=16)

    def cfg():
        return TrainConfig(steps=10, lr=3e-3, warmup=2, tokens_per_batch=512, max_len=64, save_every=3,
                           eval_every=100, autocast="off")

    torch.manual_seed(3)
    ref = Medusa(tiny_target, {"heads": 2})
    Trainer(ref, data, cfg(), tmp_path / "ref").train()

    repo = make_repo(tmp_path)
    out = repo / "checkpoints" / "in-training" / "medusa"
    torch.manual_seed(3)
    d = Medusa(tiny_target, {"heads": 2})
    real, calls = Medusa.loss, {"n": 0}

    def stopped(self, batch):
        calls["n"] += 1
        if calls["n"] == 8:  # the session ends during step 8
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(Medusa, "loss", stopped)
    try:
        Trainer(d, data, cfg(), out, commit_every_s=1e-9).train()
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(Medusa, "loss", real)
    assert "training state: medusa medusa at step 7" in git(repo, "log", "-1", "--format=%s")

    clone = tmp_path / "next-machine"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    torch.manual_seed(12345)  # a fresh process: everything must come from the committed state
    d2 = Medusa(tiny_target, {"heads": 2})
    t2 = Trainer(d2, data, cfg(), clone / "checkpoints" / "in-training" / "medusa")
    assert t2.try_resume() and t2.step == 7
    t2.train()
    for (k, a), b in zip(ref.state_dict().items(), d2.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
