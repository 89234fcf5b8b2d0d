"""Methods from outside the repository, both routes, each run by cli.py in a subprocess started
outside the checkout: an installed package's `specbench.methods` entry point (examples/ngram_drafter,
pip-installed into a temporary folder that only PYTHONPATH points at) and a `module:Class` path to
a module that was never installed. Nothing in the harness knows either drafter."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAST_CHECK = ["--target", "tiny", "--prompts", "1", "--max-new-tokens", "16", "--law-samples", "300"]

# A drafter in a module of its own: it proposes the root's token twice (right whenever the text repeats).
ECHO = '''
import torch

from harness.core.tree import DraftTree
from methods.common.base import Drafter


class EchoDrafter(Drafter):
    """Drafts the root's token again, twice."""

    name = "echo"
    defaults = {"repeats": 2}

    def propose(self, ctx):
        k = min(self.config["repeats"], ctx.max_nodes - 1)
        return DraftTree.chain(ctx.root, [ctx.root] * k) if k > 0 else DraftTree.root_only(ctx.root)
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """examples/ngram_drafter installed with pip into a fresh folder (built from a copy, so the
    checkout gains no build files; no network: its only build requirement is the local setuptools)."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    shutil.copytree(REPO / "examples" / "ngram_drafter", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "--target", str(site), str(src)], check=True, capture_output=True)
    return site


def cli(args: list[str], pythonpath: Path | str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def test_an_installed_entry_point_is_listed_and_runs_by_name(installed, tmp_path):
    listing = cli(["list"], installed, tmp_path)
    assert listing.returncode == 0, listing.stderr
    row = next((line for line in listing.stdout.splitlines() if "│ ngram " in line), "")
    assert "N-gram" in row and "entry point (specbench-ngram-drafter)" in row, listing.stdout
    check = cli(["check-method", "ngram", *FAST_CHECK], installed, tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "PASS: ngram every check passed" in check.stdout


def test_without_the_install_the_name_is_unknown(tmp_path):
    out = cli(["check-method", "ngram", "--target", "tiny"], "", tmp_path)
    assert out.returncode == 2 and "unknown method 'ngram'" in out.stdout + out.stderr


def test_a_module_class_path_runs_without_installing(tmp_path):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "my_module.py").write_text(ECHO)
    out = cli(["check-method", "my_pkg.my_module:EchoDrafter", *FAST_CHECK], tmp_path, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: my_pkg.my_module:EchoDrafter every check passed" in out.stdout


@pytest.mark.slow
@pytest.mark.smollm2
def test_compare_gives_the_plugin_a_row_and_no_mismatch(installed, tmp_path, shared_data):
    run = tmp_path / "run"
    out = cli(["compare", "--methods", "pld,ngram", "--benchmarks", "mt_bench", "--limit", "1", "--max-new-tokens",
               "16", "--dtype", "float32", "--data-dir", str(shared_data), "--out", str(run)], installed, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r["method"]: r for r in csv.DictReader((run / "summary.csv").open())}
    assert int(rows["ngram"]["mismatches"]) == 0 and int(rows["ngram"]["answers"]) >= 1
    assert any("N-gram" in p.read_text() for p in (run / "tables").glob("*.md"))
