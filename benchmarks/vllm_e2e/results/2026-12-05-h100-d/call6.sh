# Call 6: cold no-LoRA then plugin servers with vLLM's routing simulator (uniform random experts per token, as
# trained routers spread them; the dummy weights' router picks a few experts), both steps profiled. A plugin mode
# that cannot finish here is skipped (compare.sh) and runs in call 7.
T=$(date +%s); bash .bundle/b/names.sh
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=${MODEL:-gpt-oss}
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts" VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
MODES=${MODES:-"nolora plugin"} PROFILE=1 PLUGIN_S=${PLUGIN_S:-400} MODE_S=200 \
  CALL_S=$(( 590 - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
grep -h "Simulating MoE routing" "$OUT"/r/*/server.log | head -2 | cut -c1-300
