#!/usr/bin/env bash
# Gumiho's trained ablations (serial layers 1/2/3, MLP heads 3/5/7) at one reduced, stated budget.
#   bash scripts/gumiho_ablation.sh train [VARIANT...]   # VARIANT: base | layers=1 | layers=3 | mlp_heads=3 | mlp_heads=7
#   bash scripts/gumiho_ablation.sh eval [ABLATE OPTIONS...]
# Every variant (the default architecture too) is trained with the same STEPS on the same data,
# into $ABL_DIR, never over the reference weights; training resumes, so rerun after any stop.
# The MLP CE is on from the start (the official schedule turns it on after epoch 2, which a
# sub-epoch budget never reaches). Pin parallel trainings to separate cores:
#   THREADS=1 taskset -c 0 bash scripts/gumiho_ablation.sh train base layers=1 mlp_heads=3
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-120}
ABL_DIR=${ABL_DIR:-checkpoints/ablation-gumiho-${STEPS}steps}
THREADS=${THREADS:-0}
phase=${1:?usage: gumiho_ablation.sh train|eval ...}; shift
case "$phase" in
  train)
    variants=("$@"); [ ${#variants[@]} -gt 0 ] || variants=(base layers=1 layers=3 mlp_heads=3 mlp_heads=7)
    for v in "${variants[@]}"; do
      sets=(--set mlp_ce_from_epoch=0); [ "$v" = base ] || sets+=(--set "$v")
      name=$(python -c "import sys; from methods.registry import get_method as g; c=g('gumiho'); \
k,_,val=sys.argv[1].partition('='); o={} if sys.argv[1]=='base' else {k:int(val)}; print(c.checkpoint_name(c.resolve_config(o)))" "$v")
      python cli.py train --method gumiho --steps "$STEPS" "${sets[@]}" --threads "$THREADS" --out "$ABL_DIR/smollm2-135m/$name"
    done ;;
  eval)
    for sweep in layers=1,2,3 mlp_heads=3,5,7; do
      SPECBENCH_CHECKPOINTS=$ABL_DIR python cli.py ablate gumiho --set "$sweep" --train-steps 0 "$@"
    done ;;
  *) echo "unknown phase '$phase': use train or eval" >&2; exit 2 ;;
esac
