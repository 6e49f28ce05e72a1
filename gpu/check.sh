#!/bin/bash
# The GPU check in one command, for a GPU machine with a bare CUDA PyTorch image and no package
# registry (e.g. the device tool: `run(command="bash gpu/check.sh", carry=[".whl"])`, about 8
# minutes). Installs .whl/ (gpu/fetch-wheels.sh made it) offline, then runs the benchmarks
# against the bounds measured in the same run, transformers on the same GPU, the CUDA suite and a
# profile, and writes report.md, report.json and logs.txt into $OUT (default ./gpu-check-out).
# Any further arguments go to `python -m bench.gpu_check` (e.g. --stages suite, --budget 300;
# --tiny --device cpu is the CPU dry run CI makes).
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec "${PYTHON:-python3}" -m bench.gpu_check "$@"
