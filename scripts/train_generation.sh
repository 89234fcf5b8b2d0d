#!/usr/bin/env bash
# One data generation for every learned drafter: the four committed SmolLM2 distill folders (base,
# second turns, two sampled; 2.03x the base data), the held-out split by prompt, float32 target
# features (the inputs of EAGLE-3's three layers extracted once, so one cache serves every method),
# and the same steps per training token (3,050 steps x 4,096 tokens).
#
# Resumable on any machine: rerun the same command. Each trainer resumes from its state in
# $OUT/<method> (committed while a training spans sessions; deleted when the final weights land);
# the feature cache ($SPECBENCH_CACHE, default ~/.cache/specbench) is rebuilt shard by shard if the
# machine lost it. Pin it to one core to keep the other free:
#   THREADS=1 taskset -c 1 bash scripts/train_generation.sh [method ...]
# Per method, the paper's form (the variant flags, if any, go after the method as --set values).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-1}
STEPS=${STEPS:-3050}
OUT=${OUT:-checkpoints/in-training/smollm2-135m}
DATA=(--data datasets/distill/smollm2-135m --data datasets/distill/smollm2-135m-followups
      --data datasets/distill/smollm2-135m-seed1-sampled --data datasets/distill/smollm2-135m-seed2-sampled)
COMMON=(--target smollm2-135m --dtype float32 --threads "$THREADS")
methods=("$@")
[ ${#methods[@]} -gt 0 ] || methods=(eagle eagle3 gumiho hydra medusa)

python cli.py features --method eagle3 "${DATA[@]}" "${COMMON[@]}"
for m in "${methods[@]}"; do
    case $m in
        eagle|gumiho) settings=(--set draft_vocab=0) ;;        # they draft from the full vocabulary
        medusa|hydra) settings=(--set share_lm_head=false) ;;  # each head owns a vocabulary projection
        eagle3) settings=(--set ttt_steps=7) ;;                # the paper's training-time test
        *) settings=() ;;
    esac
    python cli.py train --method "$m" "${DATA[@]}" "${COMMON[@]}" --steps "$STEPS" "${settings[@]}" --out "$OUT/$m" \
        --commit-every "${COMMIT_EVERY:-30}"
done
