#!/usr/bin/env bash
# The checks on attached accelerators (one GPU or more), each step's output in one log:
#   1. the devices and the JAX that drives them;
#   2. `autoplan profile -o cluster.json` (the measured cluster) and its summary;
#   3. `autoplan plan` + `autoplan launch` (platform detected, not passed) of tiny GPT and of the
#      user module tests/user_models/optax_mlp.py (an optax step named as module:function),
#      each checked against single-device execution;
#   4. benchmarks/fidelity.py on the measured profile and the dgx-h100 preset: models sized for
#      one GPU (--sizes accel), at two batches; on one GPU the candidates are remat off/on x 1, 2,
#      4, 8 accumulated micro-batches.
# Usage: benchmarks/accelerator.sh [OUT_DIR] (default accelerator-checks/); PYTHON picks the
# interpreter (default python3), PROFILE_ARGS extra `autoplan profile` options (--quick),
# FIDELITY_MODELS the models (default "gpt mlp user_mlp"), FIDELITY_ARGS the sizes and batches
# (default "--sizes accel --batch-scales 0.5 1") and FIDELITY_TIMEOUT the seconds per model and
# batch (default 400). A failed step is logged and the next one runs.
set -u
out=$(mkdir -p "${1:-accelerator-checks}" && cd "${1:-accelerator-checks}" && pwd)
py=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3}"; exit 2; }
case $py in /*) ;; *) py="$PWD/$py" ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ap() { "$py" -m autoplan "$@"; }
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
{
  step "devices"
  "$py" -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__); print(jax.devices())"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

  step "autoplan profile"
  # shellcheck disable=SC2086
  time ap profile -o "$out/cluster.json" --no-progress ${PROFILE_ARGS:-} \
    || time ap profile -o "$out/cluster.json" --no-progress --quick
  "$py" -c "import autoplan; print(autoplan.Cluster.from_json('$out/cluster.json').summary())"

  step "tiny GPT: plan on the measured cluster, launch (platform detected)"
  ap plan gpt --size tiny --cluster "$out/cluster.json" -o "$out/gpt_tiny.json" \
    && ap launch "$out/gpt_tiny.json" --model gpt --size tiny --steps 5

  step "user module optax_mlp:workload: plan, launch (platform detected)"
  (cd "$root/tests/user_models" \
    && ap plan optax_mlp:workload --set layers=4 --cluster "$out/cluster.json" -o "$out/optax_mlp.json" \
    && ap launch "$out/optax_mlp.json" --model optax_mlp:workload --set layers=4 --steps 5)

  step "fidelity on one device: predicted against measured step times"
  # shellcheck disable=SC2086
  JAX_PLATFORMS=${JAX_PLATFORMS:-cuda} "$py" "$root/benchmarks/fidelity.py" \
    --profile "$out/cluster.json" ${FIDELITY_ARGS:---sizes accel --batch-scales 0.5 1} \
    --models ${FIDELITY_MODELS:-gpt mlp user_mlp} --steps 6 \
    --timeout "${FIDELITY_TIMEOUT:-400}" --json "$out/fidelity.json"
  step "done"
} 2>&1 | tee "$out/log.txt"
