# Call 3: second pods from call 2's plugin cache: the LoRA stream at every size (the bound before lora_stream) against
# the bound of 1024 tokens, both with the launch-config cache.
bash .bundle/b/names.sh
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
PLUGIN_ENV=${PLUGIN_ENV:-} MODES=${MODES:-plugin.2} PLUGIN_S=140 MODE_S=100 CALL_S=${CALL_S:-400} \
  bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
