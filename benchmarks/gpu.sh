#!/usr/bin/env bash
# The accelerator benchmark (benchmarks/gpu.py): one device call of under 10 minutes (the accelerator issue's
# four parts under 8), results in
# benchmarks/results/gpu.{json,md} (and the GPU rows of fljax/models/conv_forms.json).
#   bash benchmarks/gpu.sh            # needs a GPU: refuses to run on a CPU backend
#   bash benchmarks/gpu.sh --dry-run  # any machine, seconds: every part at toy sizes
#   bash benchmarks/gpu.sh emnist text  # only these parts, in this order; the other parts' results are kept
# Each part runs in its own process under its own time limit (seconds below: 450 for the accelerator issue's four parts, 550 in all), in the issue's order;
# a part that fails or runs out of time keeps what it saved and the next one runs (a part that ignores the
# SIGTERM at its limit, e.g. inside an XLA compile while the run's signal handler waits for the block, is killed 10 s later). PYTHON picks the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
dry=
parts=()
extra=()  # passed to every gpu.py call (--out DIR)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=--dry-run ;;
    --out) extra+=(--out "${2:?benchmarks/gpu.sh: --out needs a folder}"); shift ;;
    emnist|cnn|dense|resnet|text) parts+=("$1") ;;
    *) echo "benchmarks/gpu.sh: unknown argument '$1'; give --dry-run, --out DIR and/or parts among emnist cnn dense resnet text" >&2
       exit 2 ;;
  esac
  shift
done
declare -A limits=([emnist]=100 [cnn]=140 [dense]=60 [resnet]=150 [text]=100)  # H200, 2026-11-27: 75, -, -, 149, 121 s
fresh=
if [[ ${#parts[@]} -eq 0 ]]; then
  parts=(emnist cnn dense resnet text)
  fresh=--fresh  # all parts: a new results file
fi
if [[ -z "$dry" ]]; then
  backend=$("$PYTHON" -c "import jax; print(jax.default_backend())")
  if [[ "$backend" != "gpu" ]]; then
    echo "benchmarks/gpu.sh: JAX's backend is '$backend', not gpu; use --dry-run to check the script" >&2
    exit 2
  fi
fi
export FLJAX_COMPILE_CACHE=${FLJAX_COMPILE_CACHE:-0}  # measure cold compiles
failed=0
for name in "${parts[@]}"; do
  limit=${limits[$name]}
  [[ -n "$dry" ]] && limit=600  # a dry run on a shared CPU: no device-sized limits
  start=$(date +%s)
  timeout -k 10 "$limit" "$PYTHON" benchmarks/gpu.py --part "$name" $fresh $dry "${extra[@]}" > /dev/null
  rc=$?
  fresh=
  echo "benchmarks/gpu.sh: part $name: exit $rc after $(( $(date +%s) - start )) s (limit $limit)" >&2
  [[ $rc -ne 0 ]] && failed=1
done
"$PYTHON" benchmarks/gpu.py $dry "${extra[@]}"
exit $failed
