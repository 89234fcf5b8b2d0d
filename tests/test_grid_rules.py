"""A grid can run some methods under a second rule at T > 0 (Medusa's typical beside lossless),
sharing AR's answers, and the report labels those rows lossy."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.runs.config import RunConfig
from harness.runs.executor import run_grid
from harness.runs.results import RunDir
from tests.conftest import make_tiny_target


def _target():
    target = make_tiny_target()
    target.encode_chat = lambda messages: [b % 90 + 1 for m in messages for b in m["content"].encode()][:40]
    target.decode = lambda ids: " ".join(map(str, ids))
    return target


def test_typical_rows_beside_lossless_share_ar(shared_data, tmp_path):
    from harness.report.run_readme import write_report

    cfg = RunConfig(methods=["pld"], benchmarks=["gsm8k"], temperatures=[0.0, 1.0], target="tiny", limit=2,
                    max_new_tokens=8, dtype="float32", typical=["pld"])
    out = run_grid(cfg, tmp_path / "grid", shared_data, Console(file=io.StringIO()), _target(), command="compare")
    recs = RunDir(out).records()
    cells = sorted({(r["method"], r["temperature"], r["acceptance"], r["lossy"]) for r in recs})
    assert cells == [("ar", 0.0, "none", False), ("ar", 1.0, "none", False), ("pld", 0.0, "greedy", False),
                     ("pld", 1.0, "lossless", False), ("pld", 1.0, "typical", True)]
    # AR ran once per prompt and temperature: the typical runner reused its answers
    assert sum(r["method"] == "ar" for r in recs) == 2 * 2
    write_report(out)
    md = (out / "tables" / "main.md").read_text()
    assert "Prompt lookup (typical, lossy)" in md  # pld's display name (methods.registry.method_info)


@pytest.mark.parametrize("temps,typical,needle", [([0.0], ["pld"], "needs a --temperature > 0"),
                                                  ([1.0], ["eagle"], "not among --methods")])
def test_typical_needs_sampling_and_a_listed_method(temps, typical, needle):
    with pytest.raises(SpecbenchError, match=needle):  # the config's own check, before anything loads
        RunConfig(methods=["pld"], benchmarks=["gsm8k"], temperatures=temps, target="tiny", limit=1,
                  max_new_tokens=4, dtype="float32", typical=typical)
