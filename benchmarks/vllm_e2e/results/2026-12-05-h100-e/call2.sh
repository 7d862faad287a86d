# GPT-OSS, experts drawn uniformly (vLLM's routing simulator), cold no-LoRA then cold plugin in one call, one pass each.
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES="nolora plugin" PLUGIN_S=260 MODE_S=150 CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
