# GPT-OSS, experts drawn uniformly, start-up only, one call: cold plugin (leaves the warm-up marker), cold no LoRA,
# then second pods: plugin.2 (skips the model warm-up on the marker), no LoRA, plugin.3 (MOELORA_WARMUP=always).
# Adapters through vLLM's runtime API after the server answers (ADAPTERS=runtime), as the agent loads them.
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export ADAPTERS=${ADAPTERS:-runtime} PASSES=0
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts" PLUGIN_ENV_3="MOELORA_WARMUP=always"
MODES="${MODES:-plugin nolora plugin.2 nolora.2 plugin.3}" PLUGIN_S=75 MODE_S=50 CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
ls -la /tmp/cc/gpt-oss-plugin/triton/moelora-warm-up/ > "$OUT/marker_ls.txt" 2>&1; cat "$OUT/marker_ls.txt"
for d in "$OUT"/r/gpt-oss-*/; do echo "== $d $(cat $d/ready_s.txt 2>/dev/null) $(cat $d/adapters_s.txt 2>/dev/null)"; grep -h "warm-up\|during inference" $d/moelora_lines.txt | cut -c1-200 | tail -4; done
python3 benchmarks/vllm_e2e/startup.py "$OUT"/r/gpt-oss-*/ > "$OUT/startup.md" 2>&1; grep -E "ready after|first line|engine process|model warm-up|graph capture|engine init" "$OUT/startup.md"
