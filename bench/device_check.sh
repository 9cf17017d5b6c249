#!/usr/bin/env bash
# SwarmKV on a machine with an NVIDIA GPU and no network, prepared to the last command.
#
#   bash bench/device_check.sh bundle                    # here, with network: .device/
#   bash bench/device_check.sh build [--cpu] [--shape S] [--installed]
#                                                        # there, first command (<= 10 min)
#   bash bench/device_check.sh run [--cpu] [--shape S] [--trials N] [--installed]
#                                                        # there, second command (<= 10 min)
#
# bundle: what such a machine lacks, in .device/ (git-ignored, under 64 MiB): the fetched and
#   patched llama.cpp tree without what a libllama build never reads (docs, tools, examples,
#   tests, other GPU backends, the model files but the two vocabularies the generated models
#   use), and wheels of cffi, pycparser and gguf for CPython 3.12 (DEVICE_PYTHON=3.11: this
#   machine's, to test the script here).
# build: installs them and SwarmKV (--no-index, --target .device/site) with the CUDA backend
#   built for this GPU's architecture only (CMAKE_CUDA_ARCHITECTURES from nvidia-smi), then
#   writes a random-weight GGUF shaped like Qwen2.5-7B, Q4_K_M (bench/device_model.py; the
#   paper's model cannot be downloaded there: the timing is what matters, the text is noise).
# run: `swarmkv info`, the CUDA tests (pytest -m cuda), then the paper configuration on that
#   model (baseline, host with the pinned CUDA_Host pool, fork, device; 2 branches, a
#   3501-token document, 3 trials after a warm-up), and device_report.md, all into $OUT (the
#   device tool's output folder; --out DIR elsewhere).
# --cpu builds and runs without CUDA and --shape small writes a small model of the same kind:
# together they test the whole script on a CPU. --installed uses the SwarmKV installed in this
# Python instead of building one (build then only writes the model): tests/model/
# test_device_check.py runs bundle, build and run that way.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$ROOT/.device"
cd "$ROOT"

verb="${1:-}"
shift || true
cpu=0 shape=qwen2.5-7b trials=3 installed=0 out="${OUT:-$ROOT/build/device-out}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpu) cpu=1 ;;
        --shape) shape="$2"; shift ;;
        --trials) trials="$2"; shift ;;
        --installed) installed=1 ;;
        --out) out="$2"; shift ;;
        *) echo "device_check.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
MODEL="$ROOT/build/device-model-$shape.gguf"
PYVER="${DEVICE_PYTHON:-3.12}"  # the device's python3 (KINDS.md); 3.11 to test here
say() { echo "device_check: [$(date -u +%T)] $*"; }

bundle() {
    python3 vendor/fetch_llama_cpp.py  # the patched tree, stamped (a no-op when current)
    rm -rf "$DEV" && mkdir -p "$DEV/wheels"
    # every file of the tree but what a libllama (+ CPU and CUDA backends) build never reads
    local skip=(docs tools examples tests benches scripts conversion media pocs grammars
        gguf-py common prompts requirements .devops .github)
    local args=()
    for d in "${skip[@]}"; do args+=(--exclude="./$d"); done
    for b in metal sycl vulkan opencl hexagon et cann musa rpc webgpu zdnn hip virtgpu \
        openvino zendnn blas kompute; do
        args+=(--exclude="./ggml/src/ggml-$b")
    done
    (cd vendor/llama.cpp && tar cf - "${args[@]}" --exclude='./models/*' . ) |
        (mkdir -p "$DEV/llama.cpp" && cd "$DEV/llama.cpp" && tar xf -)
    mkdir -p "$DEV/llama.cpp/models"
    cp vendor/llama.cpp/models/ggml-vocab-qwen2.gguf vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf \
        "$DEV/llama.cpp/models/"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DEV/wheels" cffi pycparser gguf
    say "bundle: $(du -sh "$DEV" | cut -f1) in $DEV (carry .device; the limit is 64 MiB)"
}

use_bundle() {
    if [[ "$installed" == 1 ]]; then
        return  # the SwarmKV already installed in this Python (the CPU test)
    fi
    export PYTHONPATH="$DEV/site${PYTHONPATH:+:$PYTHONPATH}"
}

build() {
    if [[ "$installed" == 1 ]]; then  # the installed SwarmKV: only the model to write
        python3 bench/device_model.py "$MODEL" --shape "$shape"
        return
    fi
    [[ -d "$DEV/llama.cpp" ]] || { echo "device_check.sh: no $DEV (bundle first)" >&2; exit 2; }
    # the bundle's tree where none is (a device machine): stamped, so the build fetches nothing
    if ! cmp -s "$DEV/llama.cpp/.swarmkv-stamp" vendor/llama.cpp/.swarmkv-stamp; then
        rm -rf vendor/llama.cpp && cp -a "$DEV/llama.cpp" vendor/llama.cpp
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$DEV/site" \
        "$DEV"/wheels/*.whl
    use_bundle
    local cuda=OFF arch_args=""
    if [[ "$cpu" == 0 ]]; then
        cuda=ON
        arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')"
        arch_args="-DCMAKE_CUDA_ARCHITECTURES=$arch"
        say "build: CUDA for sm_$arch ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    fi
    SWARMKV_CUDA="$cuda" CMAKE_ARGS="$arch_args" python3 -m pip install -q --no-index \
        --no-deps --no-build-isolation --target "$DEV/site" --upgrade \
        -C build-dir="build/device-$cuda" .
    say "build: installed; writing the $shape model"
    python3 bench/device_model.py "$MODEL" --shape "$shape"
    say "build: done"
}

run() {
    use_bundle
    [[ -f "$MODEL" ]] || { echo "device_check.sh: no $MODEL (build first)" >&2; exit 2; }
    mkdir -p "$out"
    local work
    work="$(mktemp -d)"
    python3 -m swarmkv info | tee "$out/info.txt"
    say "run: the CUDA tests"
    set +e
    python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/native/test_cuda.py \
        >"$out/cuda-tests.log" 2>&1
    local tests_rc=$?
    set -e
    tail -n 5 "$out/cuda-tests.log"
    say "run: the paper configuration, $trials trials"
    python3 -m swarmkv bench --paper --modes baseline,host,fork,device -m "$MODEL" \
        --trials "$trials" --no-memory-probe --out "$work/paper" >"$out/paper.log" 2>&1
    cp "$work/paper/report.md" "$out/paper-report.md"
    cp "$work/paper/best_run.json" "$out/paper-best_run.json"
    python3 bench/device_report.py "$out" "$tests_rc" "$shape" >"$out/device_report.md"
    cat "$out/device_report.md"
    say "run: done ($out)"
}

case "$verb" in
    bundle) bundle ;;
    build) build ;;
    run) run ;;
    *) echo "usage: bash bench/device_check.sh bundle|build|run [--cpu] [--shape S] ..." >&2
       exit 2 ;;
esac
