"""`python -m tests.tiny_cli ARGS`: the CLI, in a process of its own, with the run's target loaded
as the tiny random Llama with a byte chat (tests/test_grid_rules.py:_target), so that tests can
drive real `cli.py run` processes against each other in seconds, without SmolLM2.

With $SPECBENCH_TEST_GATE=PATH the process, once it loads its target (so after it took its run
folder), writes PATH.waiting-<pid> and waits until PATH exists: a test holds it there while it
starts a second writer.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def gated_target(cfg, console):
    from tests.test_grid_rules import _target

    gate = os.environ.get("SPECBENCH_TEST_GATE")
    if gate:
        Path(f"{gate}.waiting-{os.getpid()}").touch()
        while not Path(gate).exists():
            time.sleep(0.02)
    return _target()


def main() -> None:
    from harness.runs import executor

    executor.load_target = gated_target
    from cli import app

    sys.argv[0] = "cli.py"
    app()


if __name__ == "__main__":
    main()
