# Call 2: the archive joined (h200_call unpacks it), then cold no-LoRA and plugin servers, one pass each.
T=$(date +%s); bash .bundle/b/names.sh
cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES="nolora plugin" PLUGIN_S=300 MODE_S=170 \
  CALL_S=$(( 590 - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
