"""Shared pytest fixtures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def in_ci() -> bool:
    """True under a CI runner (CI=true, as GitHub Actions and most CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark data folder: $SPECBENCH_DATA, else ../shared/data beside the checkout (X/main -> X/shared).

    Without the prompts the tests that need them skip with one line saying how to get them; under
    CI=true they fail instead, so a CI job cannot pass while testing nothing.
    """
    from harness.runs.benchmarks import BENCHMARKS

    env = os.environ.get("SPECBENCH_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    missing = [name for name, e in BENCHMARKS.items() if not (path / e["dir"] / e["file"]).is_file()]
    if missing:
        what = "" if len(missing) == len(BENCHMARKS) else f" (missing {', '.join(missing)})"
        msg = (f"benchmark prompts not in {path}{what}: run `python cli.py fetch-data DIR`, "
               "then set SPECBENCH_DATA=DIR (the CLI takes --data-dir DIR)")
        if in_ci():
            pytest.fail(msg + " [CI=true: missing prompts fail]", pytrace=False)
        pytest.skip(msg)
    return path


def make_tiny_target(vocab: int = 96, hidden: int = 64, layers: int = 2, seed: int = 0, device=None, dtype=None,
                     name: str = "tiny-llama"):
    """The tiny random Llama (harness/core/tiny_target.py) as a Target on `device` (default cpu) in
    `dtype` (default float32); `Target.load("tiny")` is this one with the defaults, named "tiny"."""
    import torch

    from harness.core.target import Target
    from harness.core.tiny_target import tiny_llama

    device, dtype = torch.device(device or "cpu"), dtype or torch.float32
    return Target(tiny_llama(vocab, hidden, layers, seed).to(device=device, dtype=dtype), None, name, device, dtype)


# ---- the device switch: `pytest --device cuda` or SPECBENCH_TEST_DEVICE=cuda ----------------------
TEST_DEVICE_ENV = "SPECBENCH_TEST_DEVICE"


def pytest_addoption(parser) -> None:
    parser.addoption("--device", default=None,
                     help=f"device the device tests run on (cpu, cuda, cuda:N); default ${TEST_DEVICE_ENV} or cpu")


@pytest.fixture(scope="session")
def test_device(request):
    """The device of the exactness, lossless-law, cache and tree tests: `--device`, else
    $SPECBENCH_TEST_DEVICE, else cpu. A CUDA device torch cannot see skips them with the reason."""
    import torch

    name = request.config.getoption("--device") or os.environ.get(TEST_DEVICE_ENV) or "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        pytest.fail(f"--device / {TEST_DEVICE_ENV} '{name}' is no device: use cpu, cuda or cuda:N", pytrace=False)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"device tests asked for {name}, but torch sees no CUDA GPU here")
    if device.type not in ("cpu", "cuda"):
        pytest.fail(f"--device / {TEST_DEVICE_ENV} '{name}': the device tests run on cpu or cuda", pytrace=False)
    return device


@pytest.fixture(scope="session")
def device_target(test_device):
    """The tiny target (float32) on the test device."""
    return make_tiny_target(device=test_device)


@pytest.fixture(scope="session")
def tiny_target():
    return make_tiny_target()


@pytest.fixture(scope="session")
def smollm2_fp32():
    """The real SmolLM2-135M target in float32, loaded once per session (installed by scripts/setup.sh)."""
    from harness.core.target import Target

    return Target.load("smollm2-135m", "cpu", "float32")
