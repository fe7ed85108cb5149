#!/usr/bin/env bash
# Create the benchmark-only environment .venv-sb3/ at the repository root with
# Stable-Baselines3 and its dependencies. SB3 never goes into the project's own .venv.
#
# Usage:  bash benchmarks/peers/setup_sb3.sh          (idempotent: skips if already set up)
#         FORCE=1 bash benchmarks/peers/setup_sb3.sh  (recreate from scratch)
#         PYTHON=/path/to/python3.11 bash benchmarks/peers/setup_sb3.sh
#         MUJOCO=1 bash benchmarks/peers/setup_sb3.sh (adds gymnasium[mujoco] for the MuJoCo
#                                                      peers, with the project's mujoco pin)
#
# torch is pinned to the project's torch (2.14.1) so both sides of a benchmark run the same
# tensor library (the CUDA wheel, taken from the local disk through pip's constraint file on
# these machines); gymnasium[classic-control] gives CartPole/Pendulum; psutil matches the
# project environment so memory can be inspected from inside a peer run when debugging.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${REPO_ROOT}/.venv-sb3"
PYTHON="${PYTHON:-python3}"
PACKAGES=("torch==2.14.1" "stable-baselines3" "gymnasium[classic-control]" "psutil")
if [[ "${MUJOCO:-0}" == "1" ]]; then
    PACKAGES+=("gymnasium[mujoco]" "mujoco>=3.1,<3.4")
fi

check() {
    "${VENV}/bin/python" - <<'PY' 2>/dev/null
import torch, stable_baselines3, gymnasium, psutil
assert torch.__version__.split("+")[0] == "2.14.1", torch.__version__
gymnasium.make("CartPole-v1")
import os
if os.environ.get("MUJOCO") == "1":
    gymnasium.make("Hopper-v5")
print(f"sb3 {stable_baselines3.__version__}, torch {torch.__version__}, "
      f"gymnasium {gymnasium.__version__}, psutil {psutil.__version__}")
PY
}

if [[ "${FORCE:-0}" == "1" && -d "${VENV}" ]]; then
    echo "FORCE=1: removing ${VENV}"
    rm -rf "${VENV}"
fi

export MUJOCO="${MUJOCO:-0}"
if [[ -x "${VENV}/bin/python" ]] && versions="$(check)"; then
    echo "${VENV} already set up (${versions}); nothing to do."
    exit 0
fi

echo "Creating ${VENV} with ${PYTHON} ($("${PYTHON}" --version))"
"${PYTHON}" -m venv "${VENV}"
"${VENV}/bin/python" -m pip install --quiet --upgrade pip
"${VENV}/bin/python" -m pip install --quiet "${PACKAGES[@]}"

if ! versions="$(check)"; then
    echo "error: ${VENV} was created but the import check failed;" \
         "rerun with FORCE=1 to rebuild it" >&2
    exit 1
fi
echo "Ready: ${VENV} (${versions})"
