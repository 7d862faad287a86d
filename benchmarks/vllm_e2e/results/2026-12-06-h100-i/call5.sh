# Call 5: two settings of the plugin server, second pods: MoE-LoRA's decode routing, and no dual LoRA stream.
STAGE=second MODES="plugin-decode.2 plugin.4" PLUGIN_ENV_4="VLLM_LORA_ENABLE_DUAL_STREAM=0" PLUGIN_S=140 LIMIT=420 \
  bash .bundle/q/qwen3_h100.sh 2>&1 | tail -12
