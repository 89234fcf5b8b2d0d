#!/usr/bin/env bash
# The project's test command (README and .ci/run both call it). pytest's exit code 5 ("no tests
# collected") is turned into a failure message rather than a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
# Default the prompts to ../shared/data only when it exists: otherwise the tests that need them
# skip naming `cli.py fetch-data DIR` (under CI=true they fail).
if [ -z "${SPECBENCH_DATA:-}" ] && [ -d ../shared/data ]; then export SPECBENCH_DATA=$(cd ../shared/data && pwd); fi
python3 -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit $rc
