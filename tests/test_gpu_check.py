"""scripts/gpu_check.py as a bare GPU box runs it, on the CPU: from a copy of the code folders alone
(harness/ methods/ cli.py pyproject.toml scripts/, under 10 MiB; no tests/), with no datasets/,
checkpoints/ or ../shared beside it, `--device cpu --quick` passes every check and writes its JSON.
The one test here that takes minutes: it is the check CI runs so the GPU script cannot rot."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COPIED = ("harness", "methods", "cli.py", "pyproject.toml", "scripts")
SECTIONS = {"exactness", "near_ties", "law", "cost_curve", "ar_vs_hf", "compare", "official"}


def code_copy(dest: Path) -> Path:
    """What travels to the GPU box: the code folders, without caches."""
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPECBENCH_") and k not in ("PYTHONPATH", "HF_HOME")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


def test_the_code_copy_is_small(tmp_path):
    copy = code_copy(tmp_path / "box")
    size = sum(p.stat().st_size for p in copy.rglob("*") if p.is_file())
    assert size < 10 * 2**20, f"the code folders weigh {size / 2**20:.1f} MiB: the GPU box takes a copy of < 10 MiB"


@pytest.mark.slow
def test_quick_check_passes_from_a_code_only_copy(tmp_path):
    copy = code_copy(tmp_path / "box" / "main")  # box/shared does not exist: nothing to read there
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--quick", "--out", str(out)],
                          cwd=copy, env=clean_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["passed"] and not doc["failures"]
    assert set(doc["sections_s"]) == SECTIONS
    rows = doc["checks"]
    exact = {(c["target"], c["method"]) for c in rows if c["section"] == "exactness" and c["ok"]}
    methods = [m.strip() for m in proc.stdout.split("methods:", 1)[1].splitlines()[0].split(",")]
    assert {"pld", "sps", "medusa", "hydra", "eagle", "eagle2", "gumiho"} <= set(methods)
    for target in ("llama-small", "qwen2-small"):
        assert {(target, m) for m in [*methods, "oracle"]} <= exact, f"{target}: a method's exactness row is missing"
    assert {c["dtype"] for c in rows if c["section"] == "near_ties"} == {"bfloat16", "float16"}
    law = {c["method"]: c for c in rows if c["section"] == "law"}
    assert law["target-law (biased control)"]["data"]["p"] < 1e-6 and law["target-law"]["data"]["p"] > 1e-3
    curve = next(c for c in rows if c["section"] == "cost_curve")
    assert set(map(int, curve["data"]["ratio"])) >= {1, 32, 64, 128}
    (imports,) = [c for c in rows if c["section"] == "imports"]
    assert imports["ok"] and not imports["data"]["outside"] and not imports["data"]["reads"]
    compare = out.parent / "gpu_check-compare"
    assert list(compare.glob("tables/*.md")) and list(compare.glob("plots/*.png"))
    assert "all checks passed" in proc.stdout


def test_guards_see_reads_and_imports_outside_the_allowed(tmp_path):
    """The script's own guards fire: a read under results/ and a code-folder import of a package the
    box does not have are both recorded (run in a subprocess: the guards stay installed for life)."""
    probe = ("import scripts.gpu_check as g\n"
             "try:\n    open(g.REPO / 'results' / 'no-such-file')\nexcept OSError:\n    pass\n"
             "try:\n    g.GUARDS._watched_import('ray', {'__name__': 'harness.runs.distributed'})\nexcept ImportError:\n    pass\n"
             "g.GUARDS._watched_import('json', {'__name__': 'harness.x'})\n"
             "print(sorted(g.GUARDS.reads), sorted(g.GUARDS.imports))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no-such-file" in proc.stdout and "['ray']" in proc.stdout
