# GPT-OSS on an H100, experts drawn uniformly: what one CUDA graph per size (vLLM's cudagraph_specialize_lora=false)
# saves a second pod and costs requests without an adapter (BASE_PASS: a base-model pass on each LoRA server).
# STAGE=cold: no LoRA and moelora cold, then (stage cold2) moelora cold with one graph per size (the flag is in
# vLLM's compile-cache key, so it needs its own first pod); STAGE=second: the three second pods, start-up only.
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
export PLUGIN_ARGS_3="--compilation-config.cudagraph_specialize_lora=false" PLUGIN_ARGS_4="--compilation-config.cudagraph_specialize_lora=false"
case ${STAGE:?cold, cold2 or second} in
  cold)   MODES="nolora plugin" BASE_PASS=1 PLUGIN_S=330 MODE_S=150 ;;
  cold2)  MODES="plugin.3" BASE_PASS=1 PLUGIN_S=300 ;;
  second) MODES="nolora.2 plugin.2 plugin.4" PASSES=0 PLUGIN_S=80 MODE_S=60 ;;
esac
export MODES BASE_PASS PASSES PLUGIN_S MODE_S
CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
