#!/usr/bin/env bash
# Run the GPU checks on a lent GPU machine that has CUDA 13 wheels (torch's nvidia-* packages) but
# neither onnxruntime-gpu nor the project's venv. Usage, from the repository root there:
#
#   bench/gpu/device.sh TARBALLS MODEL_DIR OUT_DIR [gpu_check args...]
#
# TARBALLS: colon-separated .tar.xz files unpacked into one site folder: an unpacked onnxruntime-gpu
# wheel plus orjson and pybase64 (edgeinfer.codec imports them), and, for the runtime bench,
# awscrt + awsiotsdk and `mosq/` (a mosquitto binary with its libraries and a wrapper script). They
# are made here with pip download + unzip and carried over in pieces, since one transfer holds
# 64 MiB. The nvidia-* folder is linked beside ORT so that ORT's own preload_dlls finds CUDA and
# cuDNN where `onnxruntime-gpu[cuda,cudnn]` would put them.
#
# GPU_RUNTIME_BENCH=1 also runs `edgeinfer bench runtime` with the CUDA provider (runtime-gpu.json);
# GPU_DIAG=1 runs bench/gpu/diag.py (where the runtime's time goes on the GPU; py-spy from site/bin).
# GPU_CHECK=0 skips gpu_check.
set -u
tarballs=$1 model=$2 out=$3
shift 3
site=/tmp/edgeinfer-site
mkdir -p "$site" "$out"
IFS=: read -ra parts <<<"$tarballs"
for t in "${parts[@]}"; do
    tar -C "$site" -xJf "$t" || { echo "cannot unpack $t"; exit 3; }
done
nvidia=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])") || { echo "no nvidia wheels"; exit 3; }
ln -sfn "$nvidia" "$site/nvidia"
# The source roots, as the editable install's .pth lists them.
export PYTHONPATH=$site:$PWD/components:$PWD/cloud:$PWD/bench PYTHONUNBUFFERED=1
[ -x "$site/mosq/mosquitto" ] && export PATH=$site/mosq:$PATH
[ -d "$site/bin" ] && export PATH=$site/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/nvidia-smi.txt"
python3 -c "import onnxruntime as o; print(o.__file__, o.__version__, o.get_available_providers())"
status=0
if [ "${GPU_CHECK:-1}" = 1 ]; then
    timeout 300 python3 bench/gpu/check.py --model-dir "$model" --json "$out/gpu_check.json" "$@" 2>&1 \
        | tee "$out/gpu_check.log"
    status=${PIPESTATUS[0]}
fi
if [ "${GPU_DIAG:-0}" = 1 ]; then
    timeout 300 python3 bench/gpu/diag.py --model-dir "$model" --out "$out" ${GPU_DIAG_ARGS:-} 2>&1 \
        | tee "$out/gpu_diag.log" | grep -v '^\s*$' | tail -40
    status=$((status | PIPESTATUS[0]))
fi
if [ "${GPU_RUNTIME_BENCH:-0}" = 1 ]; then
    timeout "${GPU_RUNTIME_BENCH_TIMEOUT:-300}" python3 -m edgeinfer bench runtime --model-dir "$model" \
        --config '{"executionProviders": ["CUDAExecutionProvider"]}' --json "$out/runtime-gpu.json" \
        ${GPU_RUNTIME_BENCH_ARGS:-} 2>&1 | tee "$out/runtime-gpu.log" | grep -v '^\s*$' | tail -40
    status=$((status | PIPESTATUS[0]))
fi
exit "$status"
