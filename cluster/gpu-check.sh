#!/usr/bin/env bash
# A GPU worker that cannot use its GPU would train on CPU for hours: fail its setup instead, and
# say why (Ray's autoscaler logs it on the head).
#   gpu-check.sh driver   before anything is installed (cluster.yaml's gpu_worker initialization_commands):
#                         a GPU is visible and its driver runs CUDA 13.0 (driver 580 or newer)
#   gpu-check.sh torch    after the install: torch is the CUDA 13.0 build and sees the GPU
# torch==2.13.0 from PyPI is built with CUDA 13.0 (it requires cuda-toolkit==13.0.3); CUDA 13.0
# needs an NVIDIA driver >= 580. The Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)
# that cluster.yaml resolves ships 580 or newer.
set -euo pipefail
MIN_DRIVER="${RERANK_LAB_MIN_DRIVER:-580}"
CUDA="13.0"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "${1:-}" in
  driver)
    if ! version="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -n 1)" || [[ -z "$version" ]]; then
        echo "rerank-lab gpu-check: no GPU visible (nvidia-smi failed) on $(hostname): a GPU instance type and an AMI with the NVIDIA driver?" >&2
        exit 1
    fi
    major="${version%%.*}"
    if (( major < MIN_DRIVER )); then
        echo "rerank-lab gpu-check: NVIDIA driver $version on $(hostname) is older than $MIN_DRIVER, which torch 2.13.0's CUDA $CUDA build needs: use the AMI cluster.yaml names" >&2
        exit 1
    fi
    echo "rerank-lab gpu-check: driver $version (>= $MIN_DRIVER) for CUDA $CUDA"
    ;;
  torch)
    "$here/../.venv/bin/python" - "$CUDA" <<'EOF'
import sys

import torch

cuda = sys.argv[1]
if torch.version.cuda is None or not torch.version.cuda.startswith(cuda):
    sys.exit(f"rerank-lab gpu-check: torch {torch.__version__} is built for CUDA {torch.version.cuda}, not {cuda}: "
             "reinstall torch==2.13.0 from PyPI")
if not torch.cuda.is_available():
    sys.exit(f"rerank-lab gpu-check: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU on this worker")
print(f"rerank-lab gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
EOF
    ;;
  *) echo "usage: gpu-check.sh driver|torch" >&2; exit 2 ;;
esac
