#!/usr/bin/env bash
# The accelerator benchmark (benchmarks/gpu.py): under 10 minutes on one H100, results in benchmarks/results/gpu.*.
#   bash benchmarks/gpu.sh            # needs a GPU: refuses to run on a CPU backend
#   bash benchmarks/gpu.sh --dry-run  # any machine, seconds: every path at toy sizes
# PYTHON picks the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ "${1:-}" != "--dry-run" ]]; then
  backend=$("$PYTHON" -c "import jax; print(jax.default_backend())")
  if [[ "$backend" != "gpu" ]]; then
    echo "benchmarks/gpu.sh: JAX's backend is '$backend', not gpu; use --dry-run to check the script" >&2
    exit 2
  fi
fi
export FLJAX_COMPILE_CACHE=${FLJAX_COMPILE_CACHE:-0}  # measure cold compiles
exec timeout 590 "$PYTHON" benchmarks/gpu.py "$@"
