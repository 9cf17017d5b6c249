#!/usr/bin/env bash
# Every study the results pages (docs/results/) quote, one after another, each writing its
# report and data into docs/results/<study>/. Run it on an idle machine from a clean checkout
# with SwarmKV installed (`pip install '.[test]'`): each result file records the commit and
# says so when the tree had uncommitted changes. About an hour and a half on 2 cores.
#
#   bash bench/run_studies.sh [STUDY ...]     # default: all of them, in this order
#
# Studies: paper branches exactness kernels floor snapshots swarm serve structured ray
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/results
studies=("$@")
[[ ${#studies[@]} -gt 0 ]] || studies=(paper branches exactness kernels floor snapshots swarm serve structured ray)

paper() {
    # The seed paper's shape: a 3501-token document, 2 branches, 16 tokens, both kernel kinds.
    swarmkv bench --paper --modes baseline,host,fork,baseline+inv,host+inv,fork+inv \
        --out "$out/paper"
}

branches() {
    # 2, 32 and 64 branches, exact (what `swarmkv run` does); the baselines once (32 and 64
    # independent contexts take minutes), every fork and host trial checked against them.
    swarmkv bench --branches 2,32,64 --doc-tokens 3501 -n 32 --trials 3 --warmup 1 \
        --reference-trials 1 --no-memory-probe --modes fork+inv,host+inv --out "$out/branches"
}

exactness() {
    # What the batch-invariant kernels cost against llama.cpp's own, end to end.
    python bench/exact_cost.py --doc-tokens 3501 --branches 1,2,32 --trials 3 --no-streams \
        -o "$out/exactness-cost/exact_cost.json"
}

kernels() {
    # SwarmKV's kernels (patches 0004, 0005, 0008) on and off, phase by phase.
    python bench/kernel_ab.py --branches 2,32,64 --trials 3 -o "$out/kernels/kernel_ab.json"
}

floor() {
    # Exact against plain, one step and a prefill at a time, and each phase against the
    # hardware floor measured in the same run.
    python bench/exact_floor.py --trials 3 --steps 8 -o "$out/exact-floor/exact_floor.json"
}

snapshots() {
    python bench/snapshot_times.py --trials 3 -o "$out/snapshots/snapshot_times.json"
    swarmkv bench --branches 2,8 --doc-tokens 3501 -n 32 --trials 3 --warmup 1 \
        --reference-trials 1 --no-memory-probe \
        --modes baseline+inv,host+inv,host+inv+shared,fork+inv,device+inv \
        --out "$out/snapshots/modes"
}

swarm() {
    # 50 agents arriving as a Poisson process at 5 per second, three seeds, and once at 2 per
    # second; llama-server with one slot and its prompt cache as the peer.
    bash bench/build_llama_server.sh >/dev/null
    for seed in 1 2 3; do
        swarmkv bench --swarm --rates 5 --agents 50 --n-range 32,32 --doc-tokens 3501 \
            --max-live 16 -t 2 --peers np1 --seed "$seed" --out "$out/swarm/rate5-seed$seed"
    done
    swarmkv bench --swarm --rates 2 --agents 50 --n-range 32,32 --doc-tokens 3501 \
        --max-live 16 -t 2 --peers np1 --seed 1 --out "$out/swarm/rate2-seed1"
    # the three seeds at 5/s: every system's and every target's median [min-max]
    python bench/swarm_runs.py --rate 5 "$out"/swarm/rate5-seed{1,2,3} \
        -o "$out/swarm/rate5-seeds.json" >/dev/null
}

serve() {
    # agents through the openai async client against swarmkv serve and llama-server
    # (-np 1, -np 16 --kv-unified, -np 16), three seeds; the HTTP overhead probe.
    bash bench/build_llama_server.sh >/dev/null
    swarmkv bench --serve --workloads shared,multiturn --agents 50 --rates 2 --trials 3 \
        --kernels exact -t 2 --out "$out/serve"
}

structured() {
    # 32 fork branches, each its own 5-field schema, free and constrained alternating.
    python bench/structured_cost.py --doc-tokens 3501 --trials 3 \
        -o "$out/structured/structured_cost.json"
}

ray() {
    python bench/ray_times.py --trials 3 -o "$out/ray/ray_times.json"
}

for study in "${studies[@]}"; do
    echo "run_studies: $study ($(date -u +%T))"
    "$study"
done
echo "run_studies: done ($(date -u +%T))"
