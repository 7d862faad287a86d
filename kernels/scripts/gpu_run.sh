#!/usr/bin/env bash
# The kernels' GPU tests and benchmarks on a CUDA machine (torch, triton and pytest installed), results in one folder.
# Usage, from the repo root: bash kernels/scripts/gpu_run.sh OUTPUT_DIR [STEP...]   (default steps: test sweep quick)
# Steps: test (tests/gpu), kernel_test (the kernel's GPU tests only), headline (the benchmark with its time
#   breakdown), sweep (a launch-parameter sweep), quick, full (presets), routes (the layer with each routing method in
#   ROUTES), sweep_direct (a sweep with direct routing), sweep_cases (a sweep of SWEEP_MODELS x SWEEP_M), grid
#   (op_grid.py for each GRIDS entry), ab (kernels/scripts/$AB_SCRIPT $AB_ARGS, an A/B comparison script).
# Each step has a timeout, changed by its *_S variable (SWEEP_S=600 ...). PACK=1 leaves OUTPUT_DIR as one archive,
# gpu_run.tgz, for copying the results off a remote machine.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:?usage: gpu_run.sh OUTPUT_DIR [STEP...]}; shift; mkdir -p "$OUT"
steps=${*:-test sweep quick}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in $steps; do
  case $step in
    test) timeout 200 python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -q -x tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" ;;
    headline) timeout 200 python3 -m moelora.kernels.tools.bench --breakdown --json "$OUT/headline.json" 2>"$OUT/headline.err" | tee "$OUT/headline.md" ;;
    sweep) timeout ${SWEEP_S:-330} python3 -m moelora.kernels.tools.bench --sweep --json "$OUT/sweep.json" 2>"$OUT/sweep.err" | tee "$OUT/sweep.md" ;;
    quick) timeout ${QUICK_S:-150} python3 -m moelora.kernels.tools.bench --preset quick --json "$OUT/quick.json" 2>"$OUT/quick.err" | tee "$OUT/quick.md" ;;
    routes) for r in ${ROUTES:-grouped direct}; do
        timeout ${ROUTES_S:-120} python3 -m moelora.kernels.tools.bench --models ${ROUTES_MODELS:-gpt-oss,qwen3} --m ${ROUTES_M:-1,16,64,256} --route $r \
          --json "$OUT/route_$r.json" 2>"$OUT/route_$r.err" | tee "$OUT/route_$r.md"; done ;;
    sweep_direct) timeout ${SWEEP_S:-330} python3 -m moelora.kernels.tools.bench --models ${SWEEP_MODELS:-gpt-oss} \
        --m ${SWEEP_M:-16,64} --route direct --sweep --breakdown --json "$OUT/sweep_direct.json" \
        2>"$OUT/sweep_direct.err" | tee "$OUT/sweep_direct.md" ;;
    sweep_cases) timeout ${SWEEP_S:-330} python3 -m moelora.kernels.tools.bench --models ${SWEEP_MODELS:-gpt-oss} \
        --m ${SWEEP_M:-64} --route ${SWEEP_ROUTE:-auto} --sweep --breakdown --json "$OUT/sweep_cases.json" \
        2>"$OUT/sweep_cases.err" | tee "$OUT/sweep_cases.md" ;;
    kernel_test) timeout ${TEST_S:-200} python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -q -x \
        tests/gpu/test_fused_moe_lora_gpu.py 2>&1 | tee "$OUT/kernel_tests.log" ;;
    grid) for g in ${GRIDS:-w13:expand w2:expand}; do timeout ${GRID_S:-150} python3 kernels/scripts/op_grid.py \
        ${GRID_MODEL:-gpt-oss} ${GRID_M:-64} ${g%:*} ${g#*:} --route ${GRID_ROUTE:-auto} 2>&1 | tee "$OUT/grid_${g/:/_}.txt"; done ;;
    ab) timeout ${AB_S:-300} python3 kernels/scripts/$AB_SCRIPT $AB_ARGS 2>&1 | tee "$OUT/ab_${AB_SCRIPT%.py}.txt" ;;
    full) timeout ${FULL_S:-400} python3 -m moelora.kernels.tools.bench --preset full --json "$OUT/full.json" 2>"$OUT/full.err" | tee "$OUT/full.md" ;;
  esac
done
tail -5 "$OUT"/*.err 2>/dev/null
if [ -n "${PACK:-}" ]; then (cd "$OUT" && tar czf /tmp/gpu_run.tgz --exclude gpu_run.tgz . && rm -rf ./* && mv /tmp/gpu_run.tgz .); fi
