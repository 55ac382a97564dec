#!/usr/bin/env bash
# On a machine with a CUDA GPU: run the additive benchmark suite on the GPU and the seed scenario
# (UCI pol, full training set, 20 Adam iterations, additive RBF), writing results named after the GPU:
#   benchmarks/results/additive-<gpu>.{json,md,png}   the suite (benchmarks/additive.py --device cuda)
#   benchmarks/results/pol-<gpu>.json                 the seed scenario (lazykern uci pol ... --json)
#   benchmarks/results/gpu-<gpu>.log                  everything printed
#
# Environment:
#   LAZYKERN_DATA  folder with pol/data.csv.gz (uci_datasets layout); without it the suite uses random
#                  inputs and the seed scenario is skipped (the GPU machine may have no internet)
#   SUITE_ARGS     extra arguments for benchmarks/additive.py, e.g. "--sizes 2000 5000 --repeats 1"
#   OUT_DIR        results folder (default benchmarks/results)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu.sh: nvidia-smi not found: run this on a machine with a CUDA GPU" >&2
    exit 2
fi
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
GPU_SLUG=$(printf '%s' "$GPU_NAME" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//')
GPU_MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
# Predicted-memory cap for the suite's peers: 80% of the GPU's memory.
CAP_GB=$(( GPU_MEM_MIB * 8 / 10 / 1024 ))
OUT_DIR=${OUT_DIR:-benchmarks/results}
LOG="$OUT_DIR/gpu-$GPU_SLUG.log"
mkdir -p "$OUT_DIR"

if ! python -c "import lazykern, pykeops, gpytorch" >/dev/null 2>&1; then
    python -m pip install --quiet -e '.[dev]'
fi
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu.sh: torch sees no CUDA device')"

# lazykern's GPU engine is KeOps: probe one KeOps compile and reduction on the GPU in its own
# process first. (Seen on an H200 with CUDA 13.0, driver 580 and pykeops 2.3: keopscore's nvrtc
# Compile segfaults on the first formula, which would otherwise kill every lazykern run of the suite.)
set +e
python - <<'PROBE'
import torch
from pykeops.torch import LazyTensor

x = torch.randn(100, 3, device="cuda")
K = (-((LazyTensor(x[:, None, :]) - LazyTensor(x[None, :, :])) ** 2).sum(-1)).exp()
value = float((K @ torch.ones(100, 1, device="cuda")).sum())
dense = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1)).sum().item()
assert abs(value - dense) <= 1e-3 * dense, (value, dense)
print(f"gpu.sh: KeOps compiled and ran a reduction on the GPU ({value:.4f} = {dense:.4f})")
PROBE
PROBE_STATUS=$?
set -e
if [ "$PROBE_STATUS" -ne 0 ]; then
    echo "gpu.sh: KeOps cannot compile or run a reduction on this GPU (exit status $PROBE_STATUS; 139 or -11 is a" \
         "segfault). lazykern runs on KeOps on GPUs, so the suite would measure nothing: install a pykeops/keopscore" \
         "build that supports this CUDA version and driver, then rerun." >&2
    exit 3
fi

{
    echo "== $(date -u +%FT%TZ) $GPU_NAME (${GPU_MEM_MIB} MiB), cap ${CAP_GB} GB"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python -c "import torch, pykeops, gpytorch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'pykeops', pykeops.__version__, 'gpytorch', gpytorch.__version__)"

    echo "== additive suite"
    # shellcheck disable=SC2086  # SUITE_ARGS is a list of arguments
    python benchmarks/additive.py --device cuda --cap-gb "$CAP_GB" --out "$OUT_DIR" \
        --name "additive-$GPU_SLUG" --note "GPU run on $GPU_NAME." ${SUITE_ARGS:-}

    echo "== seed scenario: pol, full training set, 20 Adam iterations, additive RBF"
    POL="${LAZYKERN_DATA:-}/pol/data.csv.gz"
    if [ -n "${LAZYKERN_DATA:-}" ] && [ -f "$POL" ]; then
        # On a GPU the CLI trains on the full training set by default.
        # GNU time adds the host's peak memory (Maximum resident set size) to the log when present.
        TIMER=(); [ -x /usr/bin/time ] && TIMER=(/usr/bin/time -v)
        "${TIMER[@]}" python -m lazykern.cli uci pol --device cuda --kernel additive-rbf --iters 20 \
            --data-dir "$LAZYKERN_DATA" --json "$OUT_DIR/pol-$GPU_SLUG.json" --quiet
    else
        echo "skipped: LAZYKERN_DATA does not hold pol/data.csv.gz"
    fi
} 2>&1 | tee "$LOG"
