# GPT-OSS, experts drawn uniformly, 8 rank-32 adapters through vLLM's runtime API, a pass a server, the H200's tables
# under this GPU's name: STAGE=cold runs both cold servers (leaving the compile caches), STAGE=second both as second
# pods from those caches, each pair in one call. Needs bench_headline.sh's /tmp/part.aa. Env: MODES, PLUGIN_S, MODE_S,
# LIMIT (the call's seconds).
T=$(date +%s); bash .bundle/q/names.sh > /dev/null
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export ADAPTERS=runtime PASSES=1 NP=64 VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=gpt-oss
export VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random PLUGIN_ARGS="--lora-target-modules qkv_proj o_proj experts"
case ${STAGE:?STAGE=cold or STAGE=second} in
  cold) MODES=${MODES:-plugin nolora}; PS=${PLUGIN_S:-300}; MS=${MODE_S:-170} ;;
  second) MODES=${MODES:-nolora.2 plugin.2}; PS=${PLUGIN_S:-170}; MS=${MODE_S:-150} ;;
  *) echo "STAGE=cold or STAGE=second"; exit 2 ;;
esac
MODES="$MODES" PLUGIN_S=$PS MODE_S=$MS CALL_S=$(( ${LIMIT:-560} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
for d in "$OUT"/r/gpt-oss-*/; do echo "== $d ready $(cat $d/ready_s.txt 2>/dev/null) adapters $(cat $d/adapters_s.txt 2>/dev/null)"; done
python3 benchmarks/vllm_e2e/startup.py "$OUT"/r/gpt-oss-*/ > "$OUT/startup.md" 2>&1
grep -E "ready after|engine process|model warm-up|graph capture|engine init" "$OUT/startup.md"
cat "$OUT"/compare-gpt-oss.md 2>/dev/null
