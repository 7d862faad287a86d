# GPT-OSS, experts drawn uniformly: second pods of both kinds (the caches of gptoss_uniform.sh's call) in one call;
# plugin.2 skips the model warm-up on the marker the cold plugin left (warm_marker), plugin.3 runs it (always).
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
export ADAPTERS=${ADAPTERS:-runtime}
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts" PLUGIN_ENV_3="MOELORA_WARMUP=always"
MODES="${MODES:-nolora.2 plugin.2 plugin.3}" PLUGIN_S=150 MODE_S=130 CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
