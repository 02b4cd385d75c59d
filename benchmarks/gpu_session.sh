#!/usr/bin/env bash
# Everything jido measures on a lent CUDA GPU, in one run (the device tool lends ~15 minutes in all):
# the triton attention kernel against SDPA, fp8 linear against bf16, the engine per backend, scheme and mode
# (CUDA graphs or eager), and where a step of it goes. About 6 minutes on an H200.
# Results go to $OUT (or ./gpu-results). Wheels the GPU machine lacks (gguf) may be carried in .whl/, and the
# CPU reference made beforehand on a CPU machine in .gpu-ref/ (`python benchmarks/cuda_engine.py --write-reference`).
#     bash benchmarks/gpu_session.sh
set -uo pipefail
out=${OUT:-gpu-results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=.:/tmp/site
fi
{
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    lscpu | grep -E 'Model name|^CPU\(s\)'
} 2>&1 | tee "$out/machine.txt"
timeout 120 python3 benchmarks/attention_triton_gpu.py --out "$out/attention_triton.md" 2>&1 | tail -40
timeout 100 python3 benchmarks/fp8_gpu.py --out "$out/fp8_linear.md" 2>&1 | tail -45
timeout 400 python3 benchmarks/cuda_engine.py --out "$out" 2>&1 | grep -v -E 'Warning|warn\(|Writing model' | tail -60
timeout 90 python3 benchmarks/cuda_step_profile.py --out "$out" --backends triton 2>&1 | grep -v -E 'Warning|warn\(|Writing model|USDT' | grep -v '^ ' | tail -8
