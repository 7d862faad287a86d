# Call 4: a second pod without the plugin's start-up warm-ups (MOELORA_WARMUP=0) against one with them, then a
# no-LoRA second pod: what the warm-ups cost a pod whose compile cache is full, and whether serving then compiles.
bash .bundle/b/names.sh
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss MOELORA_LOG_COMPILES=1
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES=${MODES:-"plugin.4 nolora.3"} PLUGIN_ENV_4=MOELORA_WARMUP=0 PLUGIN_S=130 MODE_S=100 CALL_S=${CALL_S:-400} \
  bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
