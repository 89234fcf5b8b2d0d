"""Sweeps on Ray (optional): a grid run as Ray tasks on a local Ray with two workers writes the
same answers and τ as the single-process run into the same kind of run folder, and a worker killed
mid-cell loses and duplicates nothing (Ray retries the cell; the driver is the one writer).
Skipped, with the reason, where Ray is not installed (`pip install ray`); under CI=true, where
scripts/setup.sh has installed it, a missing Ray fails instead."""
from __future__ import annotations

import io
import json

import pytest

from tests.conftest import in_ci

try:
    import ray
except ImportError:
    if in_ci():
        pytest.fail("Ray is not installed, though scripts/setup.sh installs it [CI=true: a missing Ray fails]",
                    pytrace=False)
    pytest.skip("Ray is optional: pip install ray", allow_module_level=True)

from rich.console import Console  # noqa: E402

from harness.runs.backends import make_backend  # noqa: E402
from harness.runs.config import RunConfig  # noqa: E402
from harness.runs.distributed import FAIL_ONCE_ENV  # noqa: E402
from harness.runs.executor import run_grid  # noqa: E402
from harness.runs.results import RunDir  # noqa: E402
from tests.test_exactness import _timeless  # noqa: E402

pytestmark = pytest.mark.smollm2
DIAGNOSTICS = ("ar_top1", "ar_gap")  # AR's top-1 logit and top-1/top-2 gap per position (near-tie accounting)


def spec() -> RunConfig:
    # The tree budget is pinned: total_tokens=auto sizes the tree from this machine's verify cost
    # at the worker's thread count (one here, two in the serial run), so the steps would differ
    return RunConfig(methods=["pld", "eagle2"], benchmarks=["mt_bench", "gsm8k"], temperatures=[0.0], limit=2,
                     max_new_tokens=32, dtype="float32", device="cpu", settings={"eagle2.total_tokens": 32})


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def serial_dir(shared_data, tmp_path_factory, smollm2_fp32):
    return run_grid(spec(), tmp_path_factory.mktemp("serial"), shared_data, Console(file=io.StringIO()), smollm2_fp32,
                    command="compare")


@pytest.mark.slow
def test_ray_cells_answer_as_the_single_process_run(shared_data, tmp_path, serial_dir, local_ray, monkeypatch):
    serial = {r["key"]: r for r in RunDir(serial_dir).records()}
    marker = tmp_path / "killed-once"
    monkeypatch.setenv(FAIL_ONCE_ENV, str(marker))  # the first cell to answer kills its worker once
    out = run_grid(spec(), tmp_path / "ray", shared_data, Console(file=io.StringIO()), command="compare",
                   backend=make_backend(ray=True, pack=True))
    assert marker.exists(), "no worker was killed: the fault path went untested"
    records = RunDir(out).records()
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)), "a retried cell duplicated records"
    assert set(keys) == set(serial)
    for r in records:
        worker = r.pop("worker")
        assert worker["threads"] == 1  # packed cells run one thread each
        mine, theirs = _timeless(r), _timeless(serial[r["key"]])
        # AR's logit diagnostics are float sums: one worker thread vs the serial run's two changes
        # their rounding, so they match within float32 error; everything else (ids, steps) exactly
        for field in DIAGNOSTICS:
            a, b = mine.pop(field, None), theirs.pop(field, None)
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-4, abs=1e-3)), field
        assert mine == theirs, f"{r['key']}: Ray answered otherwise"
    meta = json.loads((out / "meta.json").read_text())
    assert set(meta["config"]["methods_resolved"]) == {"ar", "pld", "eagle2"}
    # The same provenance as the local backend's, target runtime included (one executor writes both).
    local = json.loads((serial_dir / "meta.json").read_text())
    assert meta["config"] == local["config"] and meta["target_runtime"] == local["target_runtime"]
    assert set(local) <= set(meta)
    # Resuming the finished folder on Ray schedules nothing and changes nothing.
    again = run_grid(spec(), tmp_path / "ray", shared_data, Console(file=io.StringIO()), command="compare",
                   backend=make_backend(ray=True, pack=True))
    assert [r["key"] for r in RunDir(again).records()] == keys
