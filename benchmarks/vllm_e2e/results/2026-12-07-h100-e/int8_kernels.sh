# Call 1: the archive's first half parked in /tmp; the int8 op checked at real shapes on the GPU (tests/gpu), then
# `python -m moelora.kernels.tools.bench` (both models, rank 32, 8 adapters) with the experts' LoRA in int8
# (expert_int8) at M = 1 to 1600, then in bf16 (served by default) at the decode sizes as this machine's baseline, on
# the H200's tables served under this GPU's name (names.sh), as the plugin runs them. Env: BENCH_S (each bench's s),
# M_INT8 (the int8 bench's token counts, default all five), WEIGHTS (default "int8 model"), SWEEP (set: the int8
# bench also searches launch configs per case, its picks in the JSON's "tuned").
T=$(date +%s); [ -f .bundle/a/part.aa ] && cp .bundle/a/part.aa /tmp/part.aa
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bash .bundle/q/names.sh > /dev/null
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd .bundle/q/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/pyd:kernels:image:operator PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -c /dev/null --rootdir=. -q -p no:cacheprovider tests/gpu/test_fused_moe_lora_gpu.py \
  -k int8 > "$OUT/gpu_int8.txt" 2>&1
echo "rc=$? after $(( $(date +%s) - T )) s" >> "$OUT/gpu_int8.txt"; tail -6 "$OUT/gpu_int8.txt"
for w in ${WEIGHTS:-int8 model}; do
  if [ $w = int8 ]; then MS=${M_INT8:-1,16,64,256,1600}; SW=${SWEEP:+--sweep}; else MS=1,16,64; SW=; fi
  timeout "${BENCH_S:-170}" python3 -m moelora.kernels.tools.bench --weights $w $SW --m $MS \
    --json "$OUT/bench_$w.json" 2>/dev/null \
    | tee "$OUT/bench_$w.md" | grep -E "^\| (gpt|qwen)"
  echo "after $(( $(date +%s) - T )) s"
done
