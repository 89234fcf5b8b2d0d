#!/usr/bin/env bash
# The float32 agreement runs of docs/peers.md: each group of peers beside ours in its own folder
# under results/reference/smollm2-135m/peers-float32/, in order. Resumable: rerun to finish a group.
# Pin it to one core and keep the other quiet when the tok/s ratios matter:
#   taskset -c 0 bash scripts/peer_agreement.sh [group ...]
set -uo pipefail
cd "$(dirname "$0")/.."
declare -A PEERS=(
    [eagle2]=spec-bench/eagle2,eagle/eagle2  [pld]=spec-bench/pld  [gumiho]=gumiho/gumiho,gumiho/gumiho-nofta
    [medusa]=spec-bench/medusa,medusa/medusa  [hydra]=spec-bench/hydra,hydra/hydra  [eagle]=spec-bench/eagle
    [eagle3]=spec-bench/eagle3,eagle/eagle3
)
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(eagle2 pld gumiho medusa hydra eagle eagle3)
for g in "${groups[@]}"; do
    [ -n "${PEERS[$g]:-}" ] || { echo "unknown group '$g': one of ${!PEERS[*]}" >&2; exit 2; }
    OMP_NUM_THREADS=1 python cli.py peers --peers "${PEERS[$g]}" --benchmarks mt_bench,gsm8k --limit 10 \
        --max-new-tokens 128 --dtype float32 --threads 1 --data-dir "${SPECBENCH_DATA:-../shared/data}" \
        --out "results/reference/smollm2-135m/peers-float32/$g" || exit $?
done
