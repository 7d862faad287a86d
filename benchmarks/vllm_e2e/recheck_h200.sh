#!/bin/bash
# Re-measure after a kernel or plugin change: the GPU tests (tests/gpu, including the plugin's hooks and the
# one-compile-per-configuration check), then the kit's end-to-end run with the plugin (two bench passes on one
# server, Triton compile log on), whose pass 1 is the p99-TTFT measurement of docs/benchmarks-history.md ("vLLM end to end").
# Usage, from the repo root on a CUDA machine: bash benchmarks/vllm_e2e/recheck_h200.sh OUTPUT_DIR
# Needs the benchmark kit and its vLLM archive (benchmarks/vllm_e2e/README.md): KIT (default .bundle/kit) and
# VLLM_ARCHIVE (default .bundle/vllm-site.tar.xz). Results in OUTPUT_DIR/recheck/; PACK=1 leaves them as one archive,
# OUTPUT_DIR/recheck.tgz, for copying them off a remote machine.
set -u
R=$(pwd); OUT=${1:?usage: recheck_h200.sh OUTPUT_DIR}; SITE=${SITE:-/tmp/vllm-site}; T0=$(date +%s)
ARCH=${VLLM_ARCHIVE:-$R/.bundle/vllm-site.tar.xz}; export PYTHONUNBUFFERED=1 SITE VLLM_ARCHIVE=$ARCH
mkdir -p "$SITE" && [ -f "$SITE/.done" ] || { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
  "$ARCH" "$SITE" && touch "$SITE/.done"; } || exit 3
mkdir -p "$OUT/recheck"
PYTHONPATH=$R/kernels:$R/image:$R/operator:$SITE timeout "${TESTS_S:-150}" python3 -m pytest -c /dev/null --rootdir=. -q tests/gpu \
  2>&1 | tail -15 | tee "$OUT/recheck/gpu_tests.txt"
echo "[$(( $(date +%s)-T0 ))s] gpu tests done"
left=$(( ${BUDGET_S:-585} - ($(date +%s) - T0) ))
MODE=plugin PASSES=2 PASS_S=120 EXTRA_ENV="VLLM_LORA_ENABLE_DUAL_STREAM=1 MOELORA_LOG_COMPILES=1" \
  timeout $((left - 10)) bash benchmarks/vllm_e2e/serve_passes.sh "$OUT/recheck" plugin
grep -h "jit_monitor\|moelora: model warm-up\|moelora: fused_moe_lora kernel" "$OUT"/recheck/plugin/server.log | cut -c1-240 | head -20
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && tar czf /tmp/recheck.tgz recheck) && rm -rf "$OUT/recheck" && mv /tmp/recheck.tgz "$OUT/"
fi
