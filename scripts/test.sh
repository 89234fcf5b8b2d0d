#!/usr/bin/env bash
# The project's test command (README and .ci/run both call it). By default the quick tier: every
# test not marked `slow` (exactness, sampling law, trees, errors and the CLI on the tiny target);
# `--all`, or CI=true, runs the slow ones too (SmolLM2 end to end, training, every method's
# conformance card). Other arguments go to pytest (a later `-m` replaces the tier's). pytest's exit
# code 5 ("no tests collected") is turned into a failure message rather than a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# Default the prompts to ../shared/data only when it exists: otherwise the tests that need them
# skip naming `cli.py fetch-data DIR` (under CI=true they fail).
if [ -z "${SPECBENCH_DATA:-}" ] && [ -d ../shared/data ]; then export SPECBENCH_DATA=$(cd ../shared/data && pwd); fi
tier=(-m "not slow")
if [ "${CI:-}" = "true" ]; then tier=(); fi
if [ "${1:-}" = "--all" ]; then tier=(); shift; fi
python3 -m pytest "${tier[@]}" "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
if [ $rc -eq 0 ] && [ ${#tier[@]} -gt 0 ]; then echo "quick tier passed; \`bash scripts/test.sh --all\` adds the slow tests (CI runs them)"; fi
exit $rc
