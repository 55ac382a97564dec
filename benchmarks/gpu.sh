#!/usr/bin/env bash
# On a machine with a CUDA GPU: the GPU benchmark, at most 9 minutes on an H200, writing
#   benchmarks/results/gpu-<gpu>.{json,md}   every part's cells: time, pair·dim/s, the GPU's peak memory
#   benchmarks/results/gpu-<gpu>.log         everything printed
# The parts (benchmarks/gpu.py; each in its own process under a hard time budget, so one crash,
# hang or out-of-memory does not stop the rest): lazykern's KeOps health check and the engine it
# picks, each GPU engine's values and gradients against the torch engine on the same GPU, the same
# first reduction on plain pykeops (the outcome a KeOps user gets), the lazy pass at N = 13,500
# and 100,000 (d = 26) and the MLL step at N = 13,500 for lazykern on Triton and on KeOps against
# GPyTorch's KeOps RBFKernel and its AdditiveStructureKernel, the seed scenario (full UCI pol, 20
# Adam steps, additive RBF), one CG iteration of kernel ridge at N = 10^6 (d = 9) and a trace-NTK
# block of the benchmark CNN at N = 4,096.
#
# Environment:
#   LAZYKERN_DATA  folder with pol/ (uci_datasets layout); default: .uci/ in the checkout (git-ignored;
#                  the device machine has no ../shared), else ../shared/uci. Without it the seed part
#                  records why it did not run.
#   OUT_DIR        results folder (default benchmarks/results)
#   BUDGET_SCALE   multiply every part's time budget (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu.sh: nvidia-smi not found: run this on a machine with a CUDA GPU" >&2
    exit 2
fi
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
GPU_SLUG=$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
OUT_DIR=${OUT_DIR:-benchmarks/results}
LOG="$OUT_DIR/gpu-$GPU_SLUG.log"
mkdir -p "$OUT_DIR"
DATA=${LAZYKERN_DATA:-}
for candidate in .uci ../shared/uci; do
    if [ -z "$DATA" ] && [ -d "$candidate/pol" ]; then DATA=$candidate; fi
done
export PYTHONUNBUFFERED=1

if ! python -c "import lazykern, pykeops, gpytorch, triton" >/dev/null 2>&1; then
    python -m pip install --quiet -e '.[dev]'
fi
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: torch sees no CUDA device')"

{
    echo "== $(date -u +%FT%TZ) $GPU_NAME"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    timeout 60 python -c "import torch, pykeops, gpytorch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'pykeops', pykeops.__version__, 'gpytorch', gpytorch.__version__, 'triton', triton.__version__)" || true
    echo "== benchmarks/gpu.py (data: ${DATA:-none})"
    # The parts' budgets add up to 500 s; this bound only catches a driver that hangs outside them.
    timeout -k 10 520 python benchmarks/gpu.py --out "$OUT_DIR" --name "gpu-$GPU_SLUG" \
        --budget-scale "${BUDGET_SCALE:-1}" ${DATA:+--data-dir "$DATA"} || echo "gpu.sh: gpu.py exited $?"
} 2>&1 | tee "$LOG"
