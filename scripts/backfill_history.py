"""Backfill results/history.jsonl from git history: the whole-grid baseline cells re-run at the
commits that changed a drafter (methods/), its weights (checkpoints/<target>/) or the core
(harness/core/, and the files that moved there), one clean commit at a time.

For each chosen commit: `git worktree add --detach /tmp/wt-<hash> <hash>`, then that commit's own
`cli.py run` with the settings of the committed baseline (results/baselines/...: methods,
benchmarks, questions per benchmark, tokens, dtype, the pinned `--set`), limited to the methods
whose code and committed weights exist at that commit; the worktree is removed after. τ and
depth-1 acceptance are computed from the records by today's statistics (one definition for every
commit) and appended as one line per cell with the commit's hash and date, the CPU kind and
`source: "backfill"`. Seconds are not kept: the backfill shares its core, so speedups would be noise.

Commits are visited last, first, then the midpoints of the widest gaps, so that a backfill stopped
early still spans the history. Resumable: a commit whose cells are all in the file is not run again; a commit whose block was
cut short is removed and run again; its run folder (under --work-dir) persists, so the commit's
own runner resumes the answers it finished. A commit that cannot run (no `cli.py run`, an option
it refuses, a worktree left dirty) gets one `skipped` line naming why, and is not retried.

Run it pinned, one thread:
    nohup taskset -c 1 env OMP_NUM_THREADS=1 python3 scripts/backfill_history.py --max-commits 16 \\
        > /tmp/backfill.log 2>&1 &
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.core.errors import SpecbenchError  # noqa: E402
from harness.runs.history import HISTORY_FILE, append_lines, history_lines  # noqa: E402
from harness.runs.regress import load_baseline  # noqa: E402
from harness.runs.run_data import load_run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "results" / "baselines" / "smollm2-135m-reference-float32.json"
SOURCE = "backfill"


@dataclass(frozen=True)
class Commit:
    sha: str
    date: str  # committer date, ISO 8601


@dataclass
class Grid:
    """The baseline's cells as `cli.py run` options (the same at every commit)."""

    methods: list[str]
    benchmarks: list[str]
    limit: int
    max_new_tokens: int
    dtype: str
    target: str
    settings: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_baseline(cls, file: Path) -> "Grid":
        data = load_baseline(file)
        prov = data["provenance"]
        methods = list(dict.fromkeys(c["method"] for c in data["cells"]))
        limits = {len(p["questions"]) for p in prov["prompts"].values()}
        if len(limits) != 1:
            raise SpecbenchError(f"{file}: benchmarks hold different question counts {sorted(limits)}; "
                                 "`cli.py run --limit` makes one")
        return cls(methods, list(prov["prompts"]), limits.pop(), int(prov["max_new_tokens"]), prov["dtype"],
                   prov["target"], dict(prov.get("settings") or {}))

    def command(self, methods: list[str], data_dir: Path, out: Path) -> list[str]:
        """`cli.py run` arguments for `methods`; --set only for those methods (old CLIs refuse a
        setting of a method they do not run)."""
        sets = []
        for key, value in self.settings.items():
            if key.split(".", 1)[0] in methods:
                sets += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
        return ["cli.py", "run", "--method", ",".join(methods), "--benchmark", ",".join(self.benchmarks),
                "--target", self.target, "--dtype", self.dtype, "--device", "cpu", "--limit", str(self.limit),
                "--max-new-tokens", str(self.max_new_tokens), *sets, "--data-dir", str(data_dir), "--out", str(out)]


# ----------------------------------------------------------------------------- which commits

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def tracked_paths(repo: Path, target: str) -> list[str]:
    """Drafters, their weights, the core, and the core's files before they moved to harness/core/."""
    # no pathspec: limited to harness/core/, git sees the new path only and no rename
    moved = git(repo, "log", "--format=", "--name-status", "-M", "--diff-filter=R")
    old = sorted({line.split("\t")[1] for line in moved.splitlines()
                  if line.startswith("R") and line.split("\t")[2].startswith("harness/core/")})
    return ["methods/", f"checkpoints/{target}/", "harness/core/", *old]


def eligible_commits(repo: Path, target: str, until: str = "HEAD") -> list[Commit]:
    """Every commit up to `until` that changed a tracked path, oldest first."""
    out = git(repo, "log", "--reverse", "--format=%H %cI", until, "--", *tracked_paths(repo, target))
    return [Commit(*line.split(" ", 1)) for line in out.splitlines() if line.strip()]


def spread(commits: list[Commit], n: int) -> list[Commit]:
    """`n` commits evenly spread over `commits`, the first and the last always among them."""
    if n >= len(commits):
        return list(commits)
    if n <= 1:
        return commits[-1:]
    idx = sorted({round(i * (len(commits) - 1) / (n - 1)) for i in range(n)})
    return [commits[i] for i in idx]


def visit_order(commits: list[Commit]) -> list[Commit]:
    """`commits` reordered so that every prefix is spread over the history: the last, the first,
    then the midpoints of the widest gaps left (a backfill stopped early still spans it all)."""
    if len(commits) <= 2:
        return list(reversed(commits))
    order, gaps = [len(commits) - 1, 0], [(0, len(commits) - 1)]
    while gaps:
        lo, hi = max(gaps, key=lambda g: (g[1] - g[0], -g[0]))
        gaps.remove((lo, hi))
        if hi - lo < 2:
            continue
        mid = (lo + hi) // 2
        order.append(mid)
        gaps += [(lo, mid), (mid, hi)]
    return [commits[i] for i in order]


def resolve(repo: Path, names: list[str]) -> list[Commit]:
    out = []
    for name in names:
        line = git(repo, "log", "-1", "--format=%H %cI", name).strip()
        out.append(Commit(*line.split(" ", 1)))
    return sorted(out, key=lambda c: c.date)


def methods_at(repo: Path, commit: Commit, grid: Grid) -> list[str]:
    """The grid's methods whose module exists at `commit` and, when trained, whose committed
    weights do (read through today's method metadata: module path and weights folder)."""
    from methods.registry import get_method

    files = set(git(repo, "ls-tree", "-r", "--name-only", commit.sha, "methods/", f"checkpoints/{grid.target}/")
                .splitlines())
    out = []
    for m in grid.methods:
        cls = get_method(m)
        if cls.__module__.replace(".", "/") + ".py" not in files:
            continue
        weights = f"checkpoints/{grid.target}/{cls.weights_name()}/" if cls.trainable else None
        if weights is None or any(f.startswith(weights) for f in files):
            out.append(m)
    return out


# ----------------------------------------------------------------------------- the history file

def done_commits(file: Path) -> set[str]:
    """Commits whose backfill block is complete (every cell it announced) or that were skipped.
    A cut-short block (a kill mid-write) is removed from the file so the commit runs again."""
    if not file.exists():
        return set()
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]  # half a line from a kill mid-write
    seen: dict[str, int] = {}
    expected: dict[str, int] = {}
    done = set()
    for line in lines:
        rec = json.loads(line)
        if rec.get("source") != SOURCE:
            continue
        if rec.get("skipped"):
            done.add(rec["commit"])
            continue
        seen[rec["commit"]] = seen.get(rec["commit"], 0) + 1
        expected[rec["commit"]] = rec["cells"]
    done |= {c for c, n in seen.items() if n == expected[c]}
    broken = set(seen) - done
    kept = [x for x in lines if json.loads(x).get("commit") not in broken or json.loads(x).get("source") != SOURCE]
    if "".join(kept) != text:
        file.write_text("".join(kept), encoding="utf-8")
    return done


# ----------------------------------------------------------------------------- one commit

class Skip(Exception):
    """This commit cannot be run; the message says why (it goes into the history file)."""


Runner = Callable[[Commit, list[str], Path], Path]


def run_in_worktree(repo: Path, grid: Grid, data_dir: Path, timeout_s: float) -> Runner:
    """The runner that checks `commit` out into /tmp/wt-<hash> and runs its own `cli.py run`."""

    def run(commit: Commit, methods: list[str], out: Path) -> Path:
        wt = Path(f"/tmp/wt-{commit.sha[:12]}")
        if wt.exists():  # left by a killed backfill
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=repo, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
        git(repo, "worktree", "add", "--detach", str(wt), commit.sha)
        try:
            if not (wt / "cli.py").exists():
                raise Skip("no cli.py at this commit")
            env = {k: v for k, v in os.environ.items() if k not in ("SPECBENCH_CHECKPOINTS", "PYTHONPATH")}
            log = out.parent / "run.log"
            with log.open("a") as f:
                try:
                    proc = subprocess.run([sys.executable, *grid.command(methods, data_dir, out)], cwd=wt, env=env,
                                          stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    raise Skip(f"cli.py run took over {timeout_s:.0f} s") from None
            if proc.returncode != 0:
                tail = [x for x in log.read_text().splitlines() if x.strip()][-1:] or ["(no output)"]
                if proc.returncode < 0:
                    raise RuntimeError(f"cli.py run killed by signal {-proc.returncode}")
                raise Skip(f"cli.py run exited {proc.returncode}: {tail[0].strip()[:300]}")
            return out
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=repo, capture_output=True)

    return run


def backfill_one(commit: Commit, grid: Grid, repo: Path, runner: Runner, work: Path) -> list[dict]:
    """History lines of one commit (its cells, or one `skipped` line)."""
    note = {"commit": commit.sha, "dirty": False, "date": commit.date, "source": SOURCE}
    methods = methods_at(repo, commit, grid)
    if not methods:
        return [{**note, "skipped": "none of the baseline's methods exists at this commit"}]
    out = work / commit.sha[:12] / "run"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        runner(commit, methods, out)
        run = load_run(out)
    except (Skip, SpecbenchError) as e:
        return [{**note, "skipped": str(e)}]
    meta = run.meta
    if meta.get("commit") != commit.sha or meta.get("dirty") is not False:
        return [{**note, "skipped": f"the run recorded commit {meta.get('commit')} dirty={meta.get('dirty')}"}]
    lines = history_lines(run, commit.sha, False, commit.date, source=SOURCE)
    # speedup None: the backfill shares its core with other work, so its seconds are not a measurement
    return [{**line, "speedup": None, "cells": len(lines)} for line in lines]


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the finished child processes of this one."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def backfill(commits: list[Commit], grid: Grid, repo: Path, runner: Runner, file: Path, work: Path,
             log: Callable[[str], None] = print) -> int:
    """Run every commit not yet in `file` and append its lines; returns how many commits ran."""
    done = done_commits(file)
    ran = 0
    for i, commit in enumerate(visit_order(commits), start=1):
        if commit.sha in done:
            log(f"[{i}/{len(commits)}] {commit.sha[:7]} already in {file.name}")
            continue
        start, cpu = time.perf_counter(), _children_cpu_s()
        lines = backfill_one(commit, grid, repo, runner, work)
        append_lines(file, lines)
        ran += 1
        what = lines[0]["skipped"] if lines[0].get("skipped") else (
            f"{len({x['method'] for x in lines})} methods, {len(lines)} cells")
        # CPU seconds beside wall seconds: on a shared core the wall time says little about the work
        log(f"[{i}/{len(commits)}] {commit.sha[:7]} {commit.date}: {what} "
            f"({time.perf_counter() - start:.0f} s wall, {_children_cpu_s() - cpu:.0f} s CPU)")
    return ran


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", help="comma-separated commits to run (default: --max-commits spread over history)")
    ap.add_argument("--max-commits", type=int, default=12, help="commits evenly spread over the eligible ones")
    ap.add_argument("--until", default="HEAD", help="last commit considered")
    ap.add_argument("--baseline", type=Path, default=BASELINE, help="baseline whose settings every commit replays")
    ap.add_argument("--history", type=Path, default=HISTORY_FILE, help="history file to append to")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("SPECBENCH_DATA", "/work/shared/data")))
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/specbench-backfill"), help="run folders (resume)")
    ap.add_argument("--timeout", type=float, default=3 * 3600, help="seconds one commit may take")
    ap.add_argument("--list", action="store_true", help="print the commits that would run, and stop")
    args = ap.parse_args(argv)
    grid = Grid.from_baseline(args.baseline)
    if args.commits:
        commits = resolve(REPO, [c.strip() for c in args.commits.split(",") if c.strip()])
    else:
        commits = spread(eligible_commits(REPO, grid.target, args.until), args.max_commits)
    if args.list:
        for c in commits:
            print(c.sha[:7], c.date, ",".join(methods_at(REPO, c, grid)) or "-")
        return 0
    runner = run_in_worktree(REPO, grid, args.data_dir.resolve(), args.timeout)
    backfill(commits, grid, REPO, runner, args.history, args.work_dir, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
