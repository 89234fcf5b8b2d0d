"""One executor, two backends: a grid answered by the Ray backend (here on an in-process stand-in
for Ray, so the driver's code runs where Ray is not installed; tests/test_ray.py runs real Ray)
writes the answers and the provenance the local backend writes, and a run folder with answers
deleted from the middle of its records resumes with exactly those answers, on either backend."""
from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from harness.runs import distributed
from harness.runs.backends import make_backend
from harness.runs.config import RunConfig
from harness.runs.executor import run_grid
from harness.runs.results import RunDir
from tests.test_exactness import _timeless
from tests.test_grid_rules import _target

QUIET = Console(file=io.StringIO())


def grid() -> RunConfig:
    return RunConfig(methods=["pld"], benchmarks=["mt_bench", "gsm8k"], temperatures=[0.0, 1.0], target="tiny",
                     limit=2, max_new_tokens=8, dtype="float32", typical=["pld"])


class StandInRay:
    """The Ray calls RayBackend makes, run in this process: a task runs when `get` asks for it."""

    def __init__(self) -> None:
        self.tasks: list[str] = []
        self.initialized = False

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **_) -> None:
        self.initialized = True

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": {"CPU": 2.0}}]

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **_):
                return self

            def remote(self, *args):
                return lambda: ray.tasks.append(fn.__name__) or fn(*args)

        return Task()

    def get(self, ref):
        return ref()

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]


def on_stand_in_ray(monkeypatch) -> StandInRay:
    ray = StandInRay()
    monkeypatch.setattr(distributed, "ray_module", lambda: ray)
    # a worker's target: the byte-chat tiny target, as the local runs get it
    monkeypatch.setattr(distributed, "_worker_target", lambda cfg, grid, threads: _target())
    return ray


def drop_lines(run_dir: Path, indices: list[int]) -> dict[str, list[int]]:
    """Delete records.jsonl lines `indices`; return {key: output_ids} of what was deleted."""
    path = run_dir / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    gone = {json.loads(lines[i])["key"]: json.loads(lines[i])["output_ids"] for i in indices}
    path.write_text("".join(line for i, line in enumerate(lines) if i not in indices))
    return gone


def cell_of(key: str) -> tuple[str, ...]:
    """A record key's cell: config hash, benchmark, temperature, rule (harness.runs.record.record_key)."""
    parts = key.split("|")
    return parts[1], parts[2], parts[5], parts[6]


def resumes_with_exactly(run_dir: Path, gone: dict[str, list[int]], rerun) -> None:
    before = (run_dir / "records.jsonl").read_text()
    rerun()
    after = (run_dir / "records.jsonl").read_text()
    assert after.startswith(before), "the records kept stay byte-identical"
    new = [json.loads(line) for line in after[len(before):].splitlines()]
    assert {r["key"]: r["output_ids"] for r in new} == gone and len(new) == len(gone)


def test_ray_backend_writes_what_the_local_backend_writes(shared_data, tmp_path, monkeypatch):
    local = run_grid(grid(), tmp_path / "local", shared_data, QUIET, _target(), command="compare")
    ray = on_stand_in_ray(monkeypatch)
    out = run_grid(grid(), tmp_path / "ray", shared_data, QUIET, command="compare", backend=make_backend(ray=True))
    mine, theirs = RunDir(out).records(), {r["key"]: r for r in RunDir(local).records()}
    # (2 MT-Bench questions x 2 turns + 2 GSM8K questions) x (T=0: ar, pld; T=1: ar, pld, pld typical)
    assert len(mine) == len(theirs) == (2 * 2 + 2) * 5
    for r in mine:
        assert set(r.pop("worker")) == {"node", "pid", "threads"}  # which worker answered, on every Ray record
        assert _timeless(r) == _timeless(theirs[r["key"]])
    # AR's cells at T=1 serve both rules: one task per (slot, benchmark, T), AR's not twice
    assert ray.tasks.count("cell_task") == 2 * (2 + 3) and ray.tasks.count("resolve_task") == 1
    meta, local_meta = (json.loads((d / "meta.json").read_text()) for d in (out, local))
    assert meta["config"] == local_meta["config"] and meta["target_runtime"] == local_meta["target_runtime"]
    assert set(meta) == set(local_meta)


def test_a_folder_missing_answers_resumes_with_exactly_those(shared_data, tmp_path, monkeypatch):
    local = run_grid(grid(), tmp_path / "g", shared_data, QUIET, _target(), command="compare")
    # a first turn whose second turn stays, an AR answer the typical rows share, a last answer
    gone = drop_lines(local, [0, 5, 29])
    resumes_with_exactly(local, gone, lambda: run_grid(grid(), local, shared_data, QUIET, _target(),
                                                      command="compare"))
    ray = on_stand_in_ray(monkeypatch)
    gone = drop_lines(local, [3, 17])
    resumes_with_exactly(local, gone, lambda: run_grid(grid(), local, shared_data, QUIET, command="compare",
                                                       backend=make_backend(ray=True)))
    assert ray.tasks.count("cell_task") == len({cell_of(k) for k in gone})  # only the cells with an answer missing
