# A cold plugin server's start-up only, with the plugin watching the garbage collector (MOELORA_STARTUP_GC=1): how
# long vLLM's full collections take and what fills the heap they traverse.
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
mkdir -p /tmp/vllm-site && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
  /tmp/vllm-site.tar.xz /tmp/vllm-site && touch /tmp/vllm-site/.done || exit 3
echo "unpacked after $(( $(date +%s) - T )) s"
KIT=$PWD/.bundle/b/kit VLLM_ARCHIVE=/tmp/vllm-site.tar.xz MODEL=gpt-oss MODE=plugin PASSES=0 \
  EXTRA_ENV="VLLM_LORA_ENABLE_DUAL_STREAM=1 MOELORA_STARTUP_GC=1" SERVER_ARGS="--lora-target-modules qkv_proj o_proj experts" \
  timeout $(( ${CALL_S:-330} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/serve_passes.sh "$OUT" gc-plugin
L=$OUT/gc-plugin/server.log
grep -E "moelora: gc|garbage collection during|took|Graph capturing finished|init engine" "$L" | cut -c1-2000 > "$OUT/gc.txt"
gzip -9 "$L"; echo "call took $(( $(date +%s) - T )) s"; grep -c "moelora: gc" "$OUT/gc.txt"; grep "garbage collection during" "$OUT/gc.txt"
