#!/usr/bin/env bash
# Build llama.cpp's libraries from the pinned tree WITHOUT SwarmKV's patches, and the logits
# driver tests/support/logits_dump.c, for tests/model/test_plain_upstream.py: SwarmKV's plain
# mode (exact=False) must compute what upstream computes, bit for bit.
#
# Optional and separate: never part of `pip install`; everything goes to build/upstream/
# (the unpatched source in src/, the CMake tree in cmake/, the driver as logits_dump).
# The libraries are built as SwarmKV's native build builds its own (vendor/build_choice.py:
# shared, -march=native through GGML_NATIVE, AMX left out, no tools), so the only difference
# between the two is the patch series. Idempotent: a second run rebuilds incrementally.
#
# Environment: JOBS (default: nproc). The last line printed is the folder of the libraries;
# the one before it, the driver.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build/upstream"
SRC="$BUILD/src"
JOBS="${JOBS:-$(nproc)}"
COMMIT="$(sed -n 's/^commit *= *"\([0-9a-f]*\)".*/\1/p' "$ROOT/vendor/llama.cpp.lock")"

# The pinned tree, verified file by file, no patches applied (the fetch script's own check).
if [[ "$(cat "$SRC/.upstream-commit" 2>/dev/null)" != "$COMMIT" ]]; then
    rm -rf "$SRC"
    python3 - "$ROOT/vendor" "$SRC" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import fetch_llama_cpp as fetch

fetch.pristine_tree(fetch.read_lock(), Path(sys.argv[2]))
EOF
    echo "$COMMIT" >"$SRC/.upstream-commit"
fi

generator=()
if command -v ninja >/dev/null 2>&1 && [[ ! -f "$BUILD/cmake/CMakeCache.txt" ]]; then
    generator=(-G Ninja)
fi
# SwarmKV's native build leaves AMX out with these flags (CMakeLists.txt); x86 only.
amx_off=""
if [[ "$(uname -m)" == "x86_64" ]]; then
    amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
# No versioned sonames: the driver then names libllama.so, which SwarmKV's libraries are too,
# so LD_LIBRARY_PATH alone picks which build it meets.
cmake -S "$SRC" -B "$BUILD/cmake" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON \
    -DCMAKE_C_FLAGS="$amx_off" \
    -DCMAKE_CXX_FLAGS="$amx_off" \
    -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON \
    -DGGML_BACKEND_DL=OFF \
    -DGGML_CPU_ALL_VARIANTS=OFF \
    -DGGML_CUDA=OFF \
    -DLLAMA_BUILD_COMMON=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_IS_DEV=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build "$BUILD/cmake" --config Release --target llama -j"$JOBS"

LIBS="$BUILD/cmake/bin"
cc -O2 -std=c11 -o "$BUILD/logits_dump" "$ROOT/tests/support/logits_dump.c" \
    -I "$SRC/include" -I "$SRC/ggml/include" -L "$LIBS" -lllama
echo "$BUILD/logits_dump"
echo "$LIBS"
