# Fresh machine, after the capture-lock fix: a cold plugin server with lora_stream's bound (1024 tokens), then a second
# pod from its cache with the bound before lora_stream (the LoRA stream at every size); both profiled (decode and
# prefill steps), so the prefill steps compare on one GPU.
T=$(date +%s); bash .bundle/b/names.sh
cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES=plugin PROFILE=plugin PLUGIN_S=150 MODE_S=150 CALL_S=$(( ${CALL_S1:-360} - ($(date +%s) - T) )) \
  bash benchmarks/vllm_e2e/h200_call.sh "$OUT/new"
PLUGIN_ENV=MOELORA_STREAM_MAX_TOKENS=100000 MODES=plugin.2 PROFILE=plugin PLUGIN_S=150 MODE_S=150 \
  CALL_S=$(( ${CALL_S:-575} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT/old"
