# Call 3: the plugin's GPU tests, then second pods from call 2's caches: lora_stream's bound (plugin.2) against the
# LoRA stream at every size (plugin.3, the bound before lora_stream), then no LoRA; served answers compared.
bash .bundle/b/names.sh
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
GPU_TESTS="plugin_gpu" TESTS_S=90 MODES="plugin.2 plugin.3 nolora.2" PLUGIN_ENV_3=MOELORA_STREAM_MAX_TOKENS=100000 \
  SERVED_CHECK=1 PLUGIN_S=140 MODE_S=100 CALL_S=${CALL_S:-585} bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
