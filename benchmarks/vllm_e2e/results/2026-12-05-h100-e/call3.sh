# GPT-OSS, experts drawn uniformly: second pods of both kinds (the caches of gptoss_uniform.sh's call) in one call.
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES="nolora.2 plugin.2" PLUGIN_S=150 MODE_S=130 CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
