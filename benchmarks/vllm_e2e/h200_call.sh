#!/bin/bash
# One device call of the end-to-end comparison, from the repo root on the H200: the vLLM archive unpacked once per
# machine and byte-compiled (an image ships its .pyc) and vLLM imported once (so the first server does not pay the
# machine's cold page cache), then compare.sh with compile caches under CACHE_ROOT (a second server of a kind starts
# as a second pod through spec.kernels.compileCache), then everything in OUTPUT_DIR/results.tgz (with PROFILE=1, each
# profiled server's decode-step breakdown, profile_step.py, beside it).
# Usage: bash benchmarks/vllm_e2e/h200_call.sh OUTPUT_DIR
# Env: MODEL, MODES, PLUGIN_S, NP (as compare.sh and serve_passes.sh), CALL_S (the call's limit less what follows,
# default 585), VLLM_ARCHIVE (default .bundle/c/vllm-site.tar.xz), KIT (default .bundle/b/kit), GPU_TESTS (below),
# SERVED_CHECK (serve_passes.sh; the servers' answers compared in OUTPUT_DIR/served_check.md).
set -u
T0=$(date +%s); R=$(pwd); OUT=${1:?usage: h200_call.sh OUTPUT_DIR}; SITE=${SITE:-/tmp/vllm-site}; mkdir -p "$OUT/r"
export KIT=${KIT:-$R/.bundle/b/kit} VLLM_ARCHIVE=${VLLM_ARCHIVE:-$R/.bundle/c/vllm-site.tar.xz} SITE
export CACHE_ROOT=${CACHE_ROOT:-/tmp/cc}
# Every call, not once a machine: each call carries a fresh tree, so tables served under another GPU's name by
# names.sh (make_bundle.sh) are gone unless made again, and a call without them measures other kernel configs.
[ -f "$R/.bundle/b/names.sh" ] && bash "$R/.bundle/b/names.sh" > /dev/null 2>&1
{ date -u +"%F %T UTC"; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
  git rev-parse HEAD 2>/dev/null; git status --short benchmarks image kernels 2>/dev/null | head -20
  echo "routing: ${VLLM_MOE_ROUTING_SIMULATION_STRATEGY:-as the model routes}"; } > "$OUT/r/info.txt"
if [ ! -f "$SITE/.done" ]; then
  mkdir -p "$SITE" && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
    "$VLLM_ARCHIVE" "$SITE" && touch "$SITE/.done" || exit 3
  python3 -m compileall -q -j 16 "$SITE" image kernels > /dev/null 2>&1
  PYTHONPATH=$SITE timeout 120 python3 -c "import torch; torch.zeros(1).cuda(); import vllm.entrypoints.openai.api_server" \
    > /dev/null 2>&1
  echo "machine set up in $(( $(date +%s) - T0 )) s" | tee -a "$OUT/r/info.txt"
fi
# GPU_TESTS=1 (or a -k expression): tests/gpu first, without the project's pytest settings (the H200 image has no
# pytest-asyncio, whose option there would fail the run), in OUTPUT_DIR/gpu_tests.txt; its time leaves the budget.
if [ -n "${GPU_TESTS:-}" ]; then
  k=(); [ "$GPU_TESTS" = 1 ] || k=(-k "$GPU_TESTS")
  PYTHONPATH=$R/kernels:$R/image:$R/operator:$SITE timeout "${TESTS_S:-150}" python3 -m pytest -c /dev/null \
    --rootdir=. -q -p no:cacheprovider tests/gpu "${k[@]}" > "$OUT/gpu_tests.txt" 2>&1
  echo "rc=$? after $(( $(date +%s) - T0 )) s" >> "$OUT/gpu_tests.txt"; tail -2 "$OUT/gpu_tests.txt"
fi
BUDGET_S=$(( ${CALL_S:-585} - ($(date +%s) - T0) - 15 )) bash benchmarks/vllm_e2e/compare.sh "$OUT/r"
echo "call took $(( $(date +%s) - T0 )) s" | tee -a "$OUT/r/info.txt"
cp "$OUT"/r/compare-*.md "$OUT/" 2>/dev/null
# SERVED_CHECK=1: each server's answers against the first server's that answered the same models (a plugin server
# against a plugin server, adapters included), else against the first server's (served_check.py compare).
declare -A first_of=(); any=""
for s in "$OUT"/r/*/served.json; do
  [ -f "$s" ] || continue; models=$(python3 -c "import json,sys; print(','.join(json.load(open(sys.argv[1]))))" "$s")
  a=${first_of[$models]:-$any}; [ -z "${first_of[$models]:-}" ] && first_of[$models]=$s; [ -z "$any" ] && any=$s
  [ -n "$a" ] && [ "$a" != "$s" ] || continue
  echo "$(basename "$(dirname "$a")") (A) against $(basename "$(dirname "$s")") (B)" >> "$OUT/served_check.md"
  python3 benchmarks/vllm_e2e/served_check.py compare "$a" "$s" >> "$OUT/served_check.md" 2>&1
done
# Each server's decode and prefill steps as vLLM timed them (serve_passes.sh keeps its per-step lines).
python3 benchmarks/vllm_e2e/iterations.py "$OUT"/r/*-*/ --json "$OUT/r/iterations.json" > "$OUT/iterations.md" 2>&1
# A profiled server (PROFILE=1): where its decode steps went, read here; its trace comes back beside the results
# only when small (a device call returns files of at most 16 MiB), never inside results.tgz.
for d in "$OUT"/r/*/prof; do
  [ -d "$d" ] || continue; n=$(basename "$(dirname "$d")")
  timeout 150 python3 benchmarks/vllm_e2e/profile_step.py "$d" --json "$d/../profile_step.json" > "$d/../profile_step.md" 2>&1
  cp "$d/../profile_step.md" "$OUT/$n-profile_step.md"
  t=$(ls -S "$d"/*.pt.trace.json* 2>/dev/null | head -1)
  [ -n "$t" ] && [ "$(stat -c %s "$t")" -lt 15000000 ] && cp "$t" "$OUT/$n.pt.trace.json.gz"
done
tar -czf "$OUT/results.tgz" --exclude='*.pt.trace.json*' -C "$OUT" r
