#!/usr/bin/env bash
# The project's test command (README and .ci/run both call it). pytest's exit code 5 ("no tests
# collected") is turned into a failure message rather than a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
export SPECBENCH_DATA=${SPECBENCH_DATA:-$(cd .. && pwd)/shared/data}
python3 -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit $rc
