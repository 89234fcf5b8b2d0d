#!/usr/bin/env bash
# Make the virtual environments the official implementations (peers) run in, beside specbench:
# one per transformers version a peer pins, each `venv --system-site-packages` (so it reuses the
# installed torch) with that transformers and the few packages the peers' model code imports.
# (loguru, addict: Gumiho imports them.) Nothing in the peer folders is edited or installed from them: the peer runner puts a peer's
# folder on sys.path of its own process.
#   PEER_VENVS  where the environments go (default .peers/ in this checkout, git-ignored)
#   PYTHON      the interpreter to base them on (default python3: the one specbench runs in)
# Which peer runs in which environment: harness/peers/catalog.py (`python cli.py peers list`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENVS=${PEER_VENVS:-.peers}
mkdir -p "$VENVS"
# transformers version -> the tokenizers and hub versions it accepts (pip resolves the rest)
declare -A PINS=(
  [4.36.2]="tokenizers>=0.14,<0.19 huggingface-hub<0.25"   # Hydra, Gumiho, Medusa (their own pins)
  [4.37.1]="tokenizers>=0.14,<0.19 huggingface-hub<0.25"   # Spec-Bench main (PLD, Lookahead, REST, ...)
  [4.50.1]="tokenizers>=0.21,<0.22 huggingface-hub<1.0"    # Spec-Bench latest-transformer
  # EAGLE's current code (its Qwen3 model needs masking_utils); kernels as 4.53 pins it, over the system one
  [4.53.3]="tokenizers>=0.21,<0.22 huggingface-hub<1.0 kernels>=0.6.1,<0.7"
)
# transformers version -> what the peers of that environment import beyond it (Spec-Bench's REST:
# DraftRetriever, whose vendored Rust source needs crates.io to build, so PyPI's wheel; its SAM-Decoding:
# datasets, imported by its automaton builder)
declare -A EXTRAS=(
  [4.37.1]="draftretriever==0.1.1 datasets==2.21.0"
)
for version in "${!PINS[@]}"; do
  env="$VENVS/transformers-$version"
  if [ ! -x "$env/bin/python" ]; then
    "$PY" -m venv --system-site-packages "$env"
  fi
  # shellcheck disable=SC2086
  "$env/bin/python" -m pip install -q "transformers==$version" ${PINS[$version]} "numpy<2.3" sentencepiece protobuf shortuuid tqdm loguru addict ${EXTRAS[$version]:-}
  "$env/bin/python" -c "import torch, transformers; print('$env: torch', torch.__version__, 'transformers', transformers.__version__)"
done
