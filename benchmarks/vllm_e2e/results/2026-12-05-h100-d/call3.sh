# Call 3: second pods from call 2's caches: the plugin as shipped (plugin.2), with startup_gc (plugin.3), no LoRA.
bash .bundle/b/names.sh
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES="plugin.2 plugin.3 nolora.2" PLUGIN_ENV_3="MOELORA_GC_FREEZE=1" PLUGIN_S=140 MODE_S=100 \
  CALL_S=${CALL_S:-590} bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
grep -hE "Available KV cache memory|Graph capturing finished|init engine" "$OUT"/r/*/server.log 2>/dev/null | cut -c1-300 > "$OUT/kv-lines.txt"
