#!/usr/bin/env bash
# Retrain learned drafters with one equal budget on all committed distilled data of SmolLM2 (base
# and second-turn shards), then write their held-out top-1 curves. Resumable: after an
# interruption rerun the same command (finished methods are skipped by their trainer state).
#   STEPS=1500 THREADS=1 OUT=/somewhere bash scripts/retrain.sh [method ...]
# (default methods: eagle medusa hydra gumiho; EAGLE-2 uses EAGLE's weights). Copy a finished
# OUT/<method> over checkpoints/smollm2-135m/<method> to make it the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-1500}
THREADS=${THREADS:-1}
OUT=${OUT:-checkpoints/retrain}
methods=("$@")
[ ${#methods[@]} -gt 0 ] || methods=(eagle medusa hydra gumiho)
for m in "${methods[@]}"; do
    python cli.py train --method "$m" --data datasets/distill/smollm2-135m \
        --data datasets/distill/smollm2-135m-followups --steps "$STEPS" --threads "$THREADS" --out "$OUT/$m"
done
python cli.py curves "${methods[@]/#/$OUT/}" --out "$OUT"
