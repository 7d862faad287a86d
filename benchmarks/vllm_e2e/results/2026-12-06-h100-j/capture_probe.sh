# Qwen3 at 8 of its 48 layers (LAYERS), experts drawn uniformly: cold plugin and no-LoRA servers (start-up only), then
# a plugin second pod with vLLM's capture phases under cProfile (raw profile back in $OUT), then second pods plain.
# Needs call1.sh's /tmp/part.aa. Env: MODES (default below), LIMIT.
export QWEN3_LAYERS=${LAYERS:-8} STAGE=cold PASSES=${PASSES:-0}
export MODES=${MODES:-plugin nolora plugin.2 plugin.3 nolora.2}
export PLUGIN_ENV_2="MOELORA_PROFILE_STARTUP=$OUT/r/qwen3-plugin.2/startup_profile MOELORA_PROFILE_STARTUP_FROM=graph-capture"
bash .bundle/q/qwen3_h100.sh
for f in "$OUT"/r/qwen3-*/startup_profile/*; do [ -f "$f" ] && cp "$f" "$OUT/"; done
for d in "$OUT"/r/qwen3-*/; do
  echo "== $d"; zcat $d/server.log.gz 2>/dev/null | grep -oE "Capturing CUDA graphs[^|]*\|[^|]*\| [0-9]+/[0-9]+ \[[^]]*\]|Graph capturing finished.*|pinned .*after its read|read .* ahead in .*" | tail -24
done
