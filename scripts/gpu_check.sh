#!/usr/bin/env bash
# The GPU validation run: real GPU numbers in results/, measured by the harness itself.
#
#   bash scripts/gpu_check.sh [--dry] [--claims | --formats] [RESULTS_ROOT]     (default RESULTS_ROOT: results)
#
# On one CUDA GPU (sized for < 8 minutes on an H200): ResNet-50 224 px at effective batch 256
# (experiments/gpu_check/resnet50.toml), ViT-B/16 and ViT-L/16 in bf16
# (experiments/gpu_check/vit.toml), one fp16 + GradScaler + SGD cell (experiments/gpu_check/fp16.toml),
# the estimator's prediction beside each measured cell (in each REPORT.md), the
# runner against a hand-written loop on one cell, the measured matmul peak and copy
# bandwidth, one `bench probe --memory-limit-gib` search, and the device's facts (scripts/gpu_facts.py:
# workspace sizes, TF32 off/on, expandable segments in effect, what an out-of-memory near the cap raises);
# then each results folder's report. Without --dry it needs a CUDA device torch can see: it never
# falls back to the CPU.
# --dry runs the same code path on the CPU with tiny models (the grids' CPU profiles); no facts step.
# --claims runs the claims grids instead (experiments/claims/, sized for ~10 minutes on an H200;
# a separate device call) and regenerates results/claims/<device tags>/CLAIMS.md, whose GPU rows
# then take precedence over the CPU and estimated ones.
# --formats runs the memory-format pairs instead (experiments/gpu_check/formats.toml, sized for under 5 minutes
# on an H200; a separate device call): eight models in NCHW and channels-last, each measured peak beside the
# estimator's and each samples/s beside the throughput model's (both committed, made without a GPU).
#
# Needs torch, timm, pandas, matplotlib, rich and pydantic; bitsandbytes is optional (its
# cells are then `skipped`). Wheels in .whl/ (git-ignored) are installed first if present,
# for machines without network. PYTHON picks the interpreter (default: .venv's, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

dry=0
claims=0
formats=0
while [[ ${1:-} == --* ]]; do
    case $1 in
        --dry) dry=1 ;;
        --claims) claims=1 ;;
        --formats) formats=1 ;;
        *) echo "gpu_check.sh: $1: unknown option; allowed: --dry, --claims, --formats" >&2; exit 2 ;;
    esac
    shift
done
if ((claims && formats)); then
    echo "gpu_check.sh: --claims and --formats are separate device calls; give one" >&2
    exit 2
fi
root=${1:-results}
python=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
device=cuda
overhead=(--rounds 2 --steps 5)
probe=(resnet50 --memory-limit-gib 8 --precision bf16)
if ((dry)); then
    device=cpu
    overhead=(--rounds 1 --steps 2 --model test_resnet --image-size 32 --micro-batch 4 --accum-steps 2)
    probe=(test_resnet --image-size 64 --memory-limit-gib 0.5 --optimizer sgd --device cpu)
fi

if compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target /tmp/bench-site .whl/*.whl
    export PYTHONPATH=/tmp/bench-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # bench itself, installed or not

if ((!dry)) && ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: torch sees no CUDA device here; this check measures a GPU (--dry: the CPU path)" >&2
    exit 2
fi

tag=$("$python" -c "from bench.measure.device import detect_device; print(detect_device('$device').tag)")
extras="$root/gpu_check/$tag"
profile=cuda; ((dry)) && profile=cpu
# The estimator needs no GPU: its CUDA-profile rows are committed, so only a missing file is made here (each one
# in the dry run). Each measured folder's report then sets the estimate beside the measurement
# (estimate_vs_measured.csv).
estimate_missing() {  # GRID... -> one `bench estimate` (one interpreter's start) of those without their rows
    local grid missing=()
    for grid in "$@"; do
        if [[ ! -f "$root/gpu_check_$(basename "$grid" .toml)/estimate/runs.csv" ]] || ((dry)); then
            missing+=("$grid")
        fi
    done
    if ((${#missing[@]})); then
        "$python" -m bench estimate --profile "$profile" --results "$root" "${missing[@]}"
    fi
}
if ((claims)); then
    echo "Claims on $tag -> $root (dry=$dry)"
    "$python" -m bench run experiments/claims/*.toml --results "$root" --device "$device"
    "$python" -m bench claims --results "$root"
    exit 0
fi
if ((formats)); then
    echo "Memory formats on $tag -> $root (dry=$dry)"
    "$python" -m bench run experiments/gpu_check/formats.toml --results "$root" --device "$device"
    estimate_missing experiments/gpu_check/formats.toml
    "$python" -m bench report "$root/gpu_check_formats/$tag"
    echo "done: $root/gpu_check_formats/$tag"
    exit 0
fi
echo "GPU check on $tag -> $root (dry=$dry)"
grids=(experiments/gpu_check/resnet50.toml experiments/gpu_check/vit.toml experiments/gpu_check/fp16.toml)
"$python" -m bench run "${grids[@]}" --results "$root" --device "$device"
estimate_missing experiments/gpu_check/resnet50.toml experiments/gpu_check/vit.toml
"$python" scripts/bench_overhead.py --device "$device" --out "$extras/overhead.csv" "${overhead[@]}"
"$python" scripts/device_peaks.py --device "$device" --out "$extras/device_peaks.csv"
"$python" -m bench probe "${probe[@]}" | tee "$extras/probe.txt"
((dry)) || "$python" scripts/gpu_facts.py --out "$extras/gpu_facts.csv"
"$python" -m bench report "$root/gpu_check_resnet50/$tag" "$root/gpu_check_vit/$tag" "$root/gpu_check_fp16/$tag"
echo "done: $root/gpu_check_resnet50/$tag, $root/gpu_check_vit/$tag, $root/gpu_check_fp16/$tag, $extras"
