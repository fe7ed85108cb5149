#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run of a few minutes (CI has no GPU):
#   1. tests/test_cuda.py: every recipe trains on the GPU and its checkpoint evaluates the
#      same on the CPU; the suite's learning tests pass with every run on the GPU;
#   2. learning bars with --accelerator gpu (seeds 0-4): ppo and dqn on CartPole-v1 (475
#      within 100k), sac on Pendulum-v1 (-200 within 20k), impala on CartPole-v1 (475
#      within 500k), as benchmarks/bench_learning.py measures them on the CPU;
#   3. frames/s on the GPU: rlkit's PPO against the plain single-file PPO on MinAtar
#      (bench_minatar_fps.py --device cuda), and PPO's Atari preset on ALE/Pong-v5.
# Everything lands in OUT_DIR (logs, result tables, run summaries). Usage:
#   bash benchmarks/gpu_check.sh OUT_DIR [PYTHON]
set -u
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUT_DIR [PYTHON]}
PY=${2:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

stamp "host: $(nproc) CPUs; $(nvidia-smi -L 2>&1 | head -1)"
"$PY" - <<'EOF' || exit 1
import importlib.metadata as m
import torch
print("versions:", {p: m.version(p) for p in
      ("torch", "torchrl", "tensordict", "lightning", "gymnasium", "ale-py", "minatar")})
print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import rlkit.algorithms  # noqa: F401  (the package imports with these versions)
EOF

# 1 and 2 together: 6 test workers and 4 benchmarks of 5 seeds share the CPUs and the GPU
stamp "tests/test_cuda.py and the bars: start"
timeout "${TEST_TIMEOUT:-270}" "$PY" -m pytest -v -n 6 -p no:cacheprovider tests/test_cuda.py \
    > "$OUT/test_cuda.log" 2>&1 &
bar() {  # algo env threshold budget eval_every
    timeout "${BAR_TIMEOUT:-270}" "$PY" benchmarks/bench_learning.py "$1" "$2" "$3" "$4" \
        --seeds 0 1 2 3 4 --jobs 5 --eval-every "$5" --timeout 260 --out "$OUT/bar_gpu_$1" \
        --note "--accelerator gpu" -- --accelerator gpu > "$OUT/bar_gpu_$1.log" 2>&1
}
BARS=${BARS:-ppo dqn sac impala}  # which bars to run
for algo in $BARS; do
    case $algo in
        ppo) bar ppo CartPole-v1 475 100000 5000 & ;;
        dqn) bar dqn CartPole-v1 475 100000 5000 & ;;
        sac) bar sac Pendulum-v1 -200 20000 1000 & ;;
        impala) bar impala CartPole-v1 475 500000 10000 & ;;
    esac
done
wait
stamp "tests and bars: done"
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/test_cuda.log" | tail -n 40
for algo in $BARS; do
    grep -h "^Solved\|^Final" "$OUT/bar_gpu_$algo.md" 2>/dev/null || tail -n 5 "$OUT/bar_gpu_$algo.log"
done

# 3. frames/s on the GPU, one program at a time
stamp "frames/s: MinAtar Breakout, rlkit vs plain PPO on cuda"
timeout "${FPS_TIMEOUT:-90}" "$PY" benchmarks/bench_minatar_fps.py --device cuda \
    --games Breakout-v1 --repeats 1 --frames 65536 --timeout 40 --python "$PY" \
    --out "$OUT/fps_minatar_ppo_gpu" > "$OUT/fps_minatar.log" 2>&1
cat "$OUT/fps_minatar.log"
stamp "frames/s: PPO's Atari preset on ALE/Pong-v5, GPU"
timeout "${ATARI_TIMEOUT:-60}" "$PY" recipes/ppo.py --env ALE/Pong-v5 --accelerator gpu \
    --total-frames 32768 --eval-every 0 --eval-episodes 1 --eval-max-steps 500 \
    --progress false --run-dir "$OUT/ppo_pong_gpu" > "$OUT/ppo_pong_gpu.log" 2>&1
tail -n 3 "$OUT/ppo_pong_gpu.log"
stamp "done"
