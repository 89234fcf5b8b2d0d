"""scripts/backfill_history.py on a tiny git repository made in the test: which commits it picks,
the grid it replays, resuming after a kill without duplicates, skipped commits, and the worktree
runner's clean-up. The per-commit run is faked with synthetic run folders (no model)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runs import history
from tests.test_regress import edit_json
from tests.test_report import write_run

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("backfill_history", REPO / "scripts" / "backfill_history.py")
bf = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bf  # dataclasses look their module up there
_spec.loader.exec_module(bf)


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str] | None = None, moves: dict[str, str] | None = None) -> str:
    for src, dst in (moves or {}).items():
        (repo / dst).parent.mkdir(parents=True, exist_ok=True)
        git(repo, "mv", src, dst)
    for path, text in (files or {}).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
        git(repo, "add", path)
    day = int(git(repo, "rev-list", "--count", "--all") or 0) + 1  # one commit a day: dates order them
    date = f"2026-01-{day:02d}T00:00:00+00:00"
    git(repo, "commit", "-q", "-m", message, env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    return git(repo, "rev-parse", "HEAD")


def module_path(method: str) -> str:
    from methods.registry import get_method

    return get_method(method).__module__.replace(".", "/") + ".py"


@pytest.fixture
def repo(tmp_path):
    """readme | old core file | pld | core moves to harness/core | docs | eagle + its weights."""
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "t")
    shas = [commit(r, "readme", {"README.md": "x"}),
            commit(r, "old core", {"harness/target.py": "a = 1\n" * 20}),
            commit(r, "pld", {module_path("pld"): "x"}),
            commit(r, "core moves", moves={"harness/target.py": "harness/core/target.py"}),
            commit(r, "docs", {"docs/a.md": "x"}),
            commit(r, "eagle", {module_path("eagle"): "x", "checkpoints/tiny/eagle/model.safetensors": "w"})]
    return r, shas


@pytest.fixture
def grid():
    return bf.Grid(["pld", "eagle"], ["mt_bench", "gsm8k"], 2, 40, "float32", "tiny",
                   {"eagle.total_tokens": 32, "medusa.tree": "cpu_15"})


def test_commits_that_touched_drafters_weights_or_core_are_picked(repo):
    r, shas = repo
    assert bf.tracked_paths(r, "tiny") == ["methods/", "checkpoints/tiny/", "harness/core/", "harness/target.py"]
    # the old core file (before the move) counts; the readme and the docs commit do not
    assert [c.sha for c in bf.eligible_commits(r, "tiny")] == [shas[1], shas[2], shas[3], shas[5]]
    commits = [bf.Commit(str(i), "") for i in range(10)]
    assert [c.sha for c in bf.spread(commits, 4)] == ["0", "3", "6", "9"]
    assert bf.spread(commits, 20) == commits and [c.sha for c in bf.spread(commits, 1)] == ["9"]
    # visited so that every prefix spans the history; each commit once
    assert [c.sha for c in bf.visit_order(commits)] == ["9", "0", "4", "6", "2", "7", "1", "3", "5", "8"]


def test_methods_at_a_commit_need_their_module_and_weights(repo, grid):
    r, shas = repo
    at = [bf.methods_at(r, bf.Commit(s, ""), grid) for s in shas]
    assert at == [[], [], ["pld"], ["pld"], ["pld"], ["pld", "eagle"]]


def test_the_grid_is_the_committed_baselines():
    g = bf.Grid.from_baseline(bf.BASELINE)
    base = json.loads(bf.BASELINE.read_text())["provenance"]
    assert (g.target, g.dtype, g.max_new_tokens, g.limit) == (base["target"], "float32", base["max_new_tokens"], 2)
    assert g.benchmarks == list(base["prompts"]) and set(g.methods) == set(base["checkpoints"])
    cmd = g.command(["pld", "eagle2"], Path("/d"), Path("/o"))
    assert cmd[:4] == ["cli.py", "run", "--method", "pld,eagle2"]
    # --set only for the methods that run
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"] == ["eagle2.total_tokens=32"]
    assert cmd[cmd.index("--limit") + 1] == "2" and cmd[-4:] == ["--data-dir", "/d", "--out", "/o"]


class FakeRunner:
    """Writes a synthetic run folder as the commit's `cli.py run` would; `fail` maps a call number
    to an exception to raise there (a kill, a refused option)."""

    def __init__(self, fail: dict[int, BaseException] | None = None, meta: dict | None = None):
        self.calls: list[tuple[str, list[str]]] = []
        self.fail = fail or {}
        self.meta = meta or {}

    def __call__(self, commit, methods, out):
        self.calls.append((commit.sha, methods))
        if len(self.calls) in self.fail:
            raise self.fail[len(self.calls)]
        write_run(out, methods=tuple(methods))
        edit_json(out / "meta.json", lambda m: m.update({"commit": commit.sha, "dirty": False, **self.meta}))
        return out


def lines_of(file: Path) -> list[dict]:
    return [json.loads(x) for x in file.read_text().splitlines() if x.strip()]


def test_a_killed_backfill_resumes_without_duplicates(repo, grid, tmp_path):
    r, shas = repo
    commits = bf.resolve(r, [shas[2], shas[3], shas[5]])
    hist, work = tmp_path / "history.jsonl", tmp_path / "work"
    hist.write_text(json.dumps({"commit": "old", "tau": 1.0}) + "\n")  # lines of `compare --record` stay
    killed = FakeRunner({2: KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        bf.backfill(commits, grid, r, killed, hist, work, log=lambda s: None)
    assert [c for c, _ in killed.calls] == [shas[5], shas[2]]  # the last commit first, then the first
    assert {x["commit"] for x in lines_of(hist)} == {"old", shas[5]}
    again = FakeRunner()
    assert bf.backfill(commits, grid, r, again, hist, work, log=lambda s: None) == 2
    assert [c for c, _ in again.calls] == [shas[2], shas[3]]
    lines = lines_of(hist)
    keys = [(x["commit"], x.get("method"), x.get("benchmark")) for x in lines]
    assert len(keys) == len(set(keys)) == 1 + 2 + 2 + 4  # pld x 2 benchmarks, then pld + eagle
    first = next(x for x in lines if x["commit"] == shas[5])
    assert first["date"] == commits[-1].date and first["source"] == "backfill" and first["dirty"] is False
    assert {"tau", "depth1", "cpu_kind", "cells"} <= set(first) and first["speedup"] is None
    assert bf.backfill(commits, grid, r, FakeRunner(), hist, work, log=lambda s: None) == 0

    # a block cut short by a kill mid-write is dropped and its commit runs again
    text = hist.read_text().splitlines(keepends=True)
    hist.write_text("".join(text[:-1]) + text[-1][:20])
    rerun = FakeRunner()
    assert bf.backfill(commits, grid, r, rerun, hist, work, log=lambda s: None) == 1
    assert [c for c, _ in rerun.calls] == [shas[3]]
    unstamped = [[{k: v for k, v in x.items() if k != "recorded"} for x in xs] for xs in (lines_of(hist), lines)]
    assert unstamped[0] == unstamped[1]
    frame = history.history_frame(hist)
    assert list(frame.drop_duplicates("commit").commit) == [shas[2], shas[3], shas[5]]


def test_commits_that_cannot_run_are_recorded_once_with_the_reason(repo, grid, tmp_path):
    r, shas = repo
    commits = bf.resolve(r, [shas[1], shas[2], shas[5]])
    hist = tmp_path / "history.jsonl"
    runner = FakeRunner({1: bf.Skip("cli.py run exited 2: error: no such option: --max-new-tokens")})
    bf.backfill(commits, grid, r, runner, hist, tmp_path / "work", log=lambda s: None)
    skipped = {x["commit"]: x["skipped"] for x in lines_of(hist) if x.get("skipped")}
    assert skipped == {shas[1]: "none of the baseline's methods exists at this commit",  # not run at all
                       shas[5]: "cli.py run exited 2: error: no such option: --max-new-tokens"}
    assert [c for c, _ in runner.calls] == [shas[5], shas[2]]
    assert bf.backfill(commits, grid, r, FakeRunner(), hist, tmp_path / "work", log=lambda s: None) == 0

    # a run that recorded another commit (or a dirty tree) is not attributed to this one
    hist2 = tmp_path / "h2.jsonl"
    bf.backfill(commits[2:], grid, r, FakeRunner(meta={"dirty": True}), hist2, tmp_path / "w2", log=lambda s: None)
    assert lines_of(hist2)[0]["skipped"] == f"the run recorded commit {shas[5]} dirty=True"


def test_the_worktree_runner_skips_with_the_commits_own_error_and_cleans_up(tmp_path, grid):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    git(r, "config", "user.email", "t@example.com")
    git(r, "config", "user.name", "t")
    no_cli = commit(r, "no cli", {"README.md": "x"})
    refuses = commit(r, "old cli", {"cli.py": "import sys\nprint('error: no such option: --max-new-tokens')\n"
                                               "sys.exit(2)\n"})
    run = bf.run_in_worktree(r, grid, tmp_path / "data", timeout_s=60)
    for sha, reason in ((no_cli, "no cli.py at this commit"),
                        (refuses, "cli.py run exited 2: error: no such option: --max-new-tokens")):
        out = tmp_path / "work" / sha[:12] / "run"
        out.parent.mkdir(parents=True)
        with pytest.raises(bf.Skip, match=reason):
            run(bf.Commit(sha, ""), ["pld"], out)
        assert not Path(f"/tmp/wt-{sha[:12]}").exists()
    assert git(r, "worktree", "list").count("\n") == 0  # only the main checkout is left
