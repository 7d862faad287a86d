# Call 4: start-up only, the order reversed: startup_gc with the collector watched (plugin.4), then as shipped (plugin.5).
bash .bundle/b/names.sh
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
MODES="plugin.4 plugin.5 plugin.6" PASSES=0 PLUGIN_ENV_4="MOELORA_GC_FREEZE=1 MOELORA_STARTUP_GC=1" \
  PLUGIN_ENV_6="MOELORA_GC_FREEZE=1" PLUGIN_S=90 CALL_S=${CALL_S:-590} bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
for d in "$OUT"/r/*plugin.4*; do zgrep -hE "moelora: gc|garbage collection" "$d"/server.log* | cut -c1-1500 > "$OUT/gc-plugin4.txt"; done
grep -hE "Available KV cache memory|Graph capturing finished|init engine" "$OUT"/r/*/server.log 2>/dev/null | cut -c1-300 > "$OUT/kv-lines.txt"
