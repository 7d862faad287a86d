#!/usr/bin/env bash
# The one-kernel op (onepass routing) on a CUDA machine: its GPU tests, then the layer benchmark before (grouped
# routing, what the plugin serves) and after (decode: one kernel per op up to 128 pairs, grouped beyond), the direct
# two-kernel path for reference, and a small sweep of the one-kernel op's launch fields. Results in one archive.
# Usage, from the repo root: bash kernels/scripts/onepass_h200.sh OUTPUT_DIR [STEP...]
# Steps: tests (the one-kernel GPU tests), decode (M = 1, 16 on grouped / onepass / direct), more (onepass at
#   M = 4, 32, 64), sweep (onepass M = 1, 16 swept), table (all M: TABLE_ROUTES, default grouped and decode), mid
#   (M = 2, 8, 32: grouped and decode), ladder (M = 1 to 32: LADDER_ROUTES, default onepass and direct), floor (kernels/scripts/launch_floor.py), alltests (tests/gpu).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:image${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:?usage: onepass_h200.sh OUTPUT_DIR [STEP...]}; shift
R=$OUT/r; mkdir -p "$R"
steps=${*:-tests decode more sweep}
B="python3 -m moelora.kernels.tools.bench"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$R/smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$R/smi.txt"
P="python3 -m pytest -c /dev/null --rootdir=. -p no:cacheprovider -q"
for step in $steps; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    tests) timeout ${TESTS_S:-150} $P -x tests/gpu/test_fused_moe_lora_gpu.py -k one_kernel 2>&1 | tail -25 | tee "$R/tests_onepass.log" ;;
    decode) for r in grouped onepass direct; do
        timeout ${DECODE_S:-90} $B --m 1,16 --route $r --json "$R/decode_$r.json" 2>"$R/decode_$r.err" | tee "$R/decode_$r.md"; done ;;
    more) timeout ${MORE_S:-60} $B --m 4,32,64 --route onepass --json "$R/more_onepass.json" 2>"$R/more_onepass.err" | tee "$R/more_onepass.md" ;;
    sweep) timeout ${SWEEP_S:-150} $B --m ${SWEEP_M:-1,16} --models ${SWEEP_MODELS:-gpt-oss,qwen3} --route onepass --sweep \
        --json "$R/sweep_onepass.json" 2>"$R/sweep_onepass.err" | tee "$R/sweep_onepass.md" ;;
    table) for r in ${TABLE_ROUTES:-grouped decode}; do
        timeout ${TABLE_S:-170} $B --route $r --json "$R/table_$r.json" 2>"$R/table_$r.err" | tee "$R/table_$r.md"; done ;;
    mid) for r in grouped decode; do
        timeout ${MID_S:-60} $B --m 2,8,32 --route $r --json "$R/mid_$r.json" 2>"$R/mid_$r.err" | tee "$R/mid_$r.md"; done ;;
    ladder) for r in ${LADDER_ROUTES:-onepass direct}; do
        timeout ${LADDER_S:-60} $B --m 1,2,4,8,16,32 --route $r --json "$R/ladder_$r.json" 2>"$R/ladder_$r.err" | tee "$R/ladder_$r.md"; done ;;
    floor) timeout ${FLOOR_S:-60} python3 kernels/scripts/launch_floor.py 2>&1 | tee "$R/floor.txt" ;;
    alltests) timeout ${ALLTESTS_S:-200} $P tests/gpu 2>&1 | tail -25 | tee "$R/tests_all.log" ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)"
tail -3 "$R"/*.err 2>/dev/null
(cd "$OUT" && tar czf results.tgz r && rm -rf r)
