#!/usr/bin/env bash
# Run bench/gpu_check.py on a lent GPU machine that has CUDA 13 wheels (torch's nvidia-* packages)
# but neither onnxruntime-gpu nor the project's venv. Usage, from the repository root there:
#
#   bench/gpu_device.sh ORT_TARBALL MODEL_DIR OUT_DIR [gpu_check args...]
#
# ORT_TARBALL: a .tar.xz of an unpacked onnxruntime-gpu wheel (plus orjson and pybase64, which
# edgeinfer.codec imports), made here with pip download + unzip, and carried over in pieces since
# one transfer holds 64 MiB. The nvidia-* folder is linked beside it so that ORT's own
# preload_dlls finds CUDA and cuDNN where `onnxruntime-gpu[cuda,cudnn]` would put them.
set -u
tarball=$1 model=$2 out=$3
shift 3
site=/tmp/edgeinfer-site pkg=/tmp/edgeinfer-pkg
mkdir -p "$site" "$pkg" "$out"
tar -C "$site" -xJf "$tarball" || { echo "cannot unpack $tarball"; exit 3; }
nvidia=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])") || { echo "no nvidia wheels"; exit 3; }
ln -sfn "$nvidia" "$site/nvidia"
ln -sfn "$PWD/components" "$pkg/edgeinfer"
export PYTHONPATH=$site:$pkg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/nvidia-smi.txt"
ls "$nvidia" | tr '\n' ' ' | tee -a "$out/nvidia-smi.txt"
echo
python3 -c "import onnxruntime as o; print(o.__file__, o.__version__, o.get_available_providers())"
timeout 300 python3 bench/gpu_check.py --model-dir "$model" --json "$out/gpu_check.json" "$@" 2>&1 \
    | tee "$out/gpu_check.log"
exit "${PIPESTATUS[0]}"
