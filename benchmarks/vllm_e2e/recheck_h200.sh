#!/bin/bash
# One device call that re-measures what the 2026-11-30 session built after its last H200 run: the GPU tests
# (tests/gpu, including the plugin's hooks and the one-compile-per-configuration check), then the kit's end-to-end
# run with the plugin (two bench passes on one server, Triton compile log on), whose pass 1 is the p99-TTFT
# measurement. Carry .bundle/vllm-site.tar.xz and .bundle/kit (see docs/benchmarks.md, "vLLM end to end").
#   run(command="OUT=$OUT bash benchmarks/vllm_e2e/recheck_h200.sh", carry=[".bundle/vllm-site.tar.xz", ".bundle/kit"])
# Everything it writes is packed into $OUT/recheck.tgz (the device tool fetches only a few files per call).
set -u
R=$(pwd); OUT=${OUT:?}; SITE=/tmp/vllm-site; T0=$(date +%s); export PYTHONUNBUFFERED=1
mkdir -p "$SITE" && [ -f "$SITE/.done" ] || { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
  "$R/.bundle/vllm-site.tar.xz" "$SITE" && touch "$SITE/.done"; } || exit 3
mkdir -p "$OUT/recheck"
PYTHONPATH=$R/kernels:$R/image:$SITE timeout "${TESTS_S:-150}" python3 -m pytest -c /dev/null --rootdir=. -q tests/gpu \
  2>&1 | tail -15 | tee "$OUT/recheck/gpu_tests.txt"
echo "[$(( $(date +%s)-T0 ))s] gpu tests done"
left=$(( ${BUDGET_S:-585} - ($(date +%s) - T0) ))
NAME=plugin MODE=plugin PASSES=2 PASS_S=120 EXTRA_ENV="VLLM_LORA_ENABLE_DUAL_STREAM=1 MOELORA_LOG_COMPILES=1" \
  OUT="$OUT/recheck" timeout $((left - 10)) bash benchmarks/vllm_e2e/serve_passes.sh
grep -h "jit_monitor\|moelora: model warm-up\|moelora: fused_moe_lora kernel" "$OUT"/recheck/plugin/server.log | cut -c1-240 | head -20
(cd "$OUT" && tar czf /tmp/recheck.tgz recheck) && rm -rf "$OUT/recheck" && mv /tmp/recheck.tgz "$OUT/"
