#!/usr/bin/env bash
# Build llama.cpp's own llama-server from the SAME pinned, patched tree SwarmKV binds
# (vendor/llama.cpp), for the benchmark's peer comparison (swarmkv/bench/peer.py).
#
# Optional and separate: never part of `pip install`; its build tree is build/llama-server/.
# Idempotent: re-running reconfigures the existing tree and rebuilds incrementally.
# Nothing is downloaded: the prebuilt web UI (HF bucket), the npm UI build, curl/OpenSSL and
# the BoringSSL/LibreSSL/llguidance fetches are all switched off, so the server embeds no UI.
#
# Environment: JOBS (default: nproc), SWARMKV_CUDA=ON to build the CUDA backend (as the
# SwarmKV wheel does with the same variable), TARGET=llama-completion to build llama.cpp's
# completion tool instead (bench/agree_llama_tool.py), TARGET=llama-parallel or llama-batched
# for its examples that share a prompt across sequences (bench/parallel_peer.py,
# bench/batched_peer.py). The last line printed is the binary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/vendor/llama.cpp"
BUILD="$ROOT/build/llama-server"
JOBS="${JOBS:-$(nproc)}"

# The tree is git-ignored and extracted on demand; a no-op when its stamp matches the lock.
python3 "$ROOT/vendor/fetch_llama_cpp.py"

generator=()
if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
fi
# The extracted tree is no git checkout: stamp the pinned commit from the lock into the
# binary instead, so `llama-server --version` names the tree it was built from.
COMMIT="$(sed -n 's/^commit *= *"\([0-9a-f]*\)".*/\1/p' "$ROOT/vendor/llama.cpp.lock")"

TARGET="${TARGET:-llama-server}"
examples=OFF
if [[ "$TARGET" == llama-parallel || "$TARGET" == llama-batched ]]; then
    examples=ON  # examples/parallel and examples/batched
fi

# A generator cannot change in an existing tree: keep whatever the first configure chose.
if [[ -f "$BUILD/CMakeCache.txt" ]]; then
    generator=()
fi

cmake -S "$SRC" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMON=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES="$examples" \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_IS_DEV=OFF \
    -DLLAMA_BUILD_COMMIT="${COMMIT:-unknown}" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_BORINGSSL=OFF \
    -DLLAMA_BUILD_LIBRESSL=OFF \
    -DLLAMA_LLGUIDANCE=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DGGML_CUDA="${SWARMKV_CUDA:-OFF}"

cmake --build "$BUILD" --config Release --target "$TARGET" -j"$JOBS"

BIN="$BUILD/bin/$TARGET"
if [[ ! -x "$BIN" ]]; then
    echo "build_llama_server.sh: expected $BIN after the build, not found" >&2
    exit 1
fi
# The tree's stamp (the lock's commit and the patches applied, in order) beside the binary:
# the benchmarks record it as the peer's patches (swarmkv_bench.serve_systems.binary_info).
cp "$SRC/.swarmkv-stamp" "$BIN.swarmkv-stamp"
echo "$BIN"
