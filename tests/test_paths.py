"""Paths written into committed provenance carry nothing of the machine that wrote them."""
from __future__ import annotations

import pytest

from harness.core.paths import REPO_ROOT, beside_repo


def test_a_folder_beside_the_checkout_is_written_relative_to_it():
    assert beside_repo(REPO_ROOT.parent / "shared" / "data") == "../shared/data"
    assert beside_repo(REPO_ROOT / "datasets") == "datasets"


def test_a_folder_elsewhere_keeps_only_its_last_two_parts(tmp_path):
    if tmp_path.resolve().is_relative_to(REPO_ROOT.parent):
        pytest.skip("this checkout's parent holds the temp folder: the case cannot be made here")
    assert beside_repo(tmp_path / "prompts" / "data") == "<outside the repository>/prompts/data"
