# Qwen3 at 8 of its 48 layers (LAYERS), experts drawn uniformly, on capture_probe.sh's caches: second pods of no LoRA
# and the plugin, then the plugin with one CUDA graph per size (cudagraph_specialize_lora=false: its own compile);
# a pass each, and a base-model pass on each plugin server (what a batch without adapters costs under either).
export QWEN3_LAYERS=${LAYERS:-8} STAGE=second PASSES=${PASSES:-1} BASE_PASS=1
export MODES=${MODES:-nolora.2 plugin.4 plugin.5}
export PLUGIN_ARGS_5="--compilation-config.cudagraph_specialize_lora=false"
bash .bundle/q/qwen3_h100.sh
for d in "$OUT"/r/qwen3-*/; do
  echo "== $d"; zcat $d/server.log.gz 2>/dev/null | grep -oE "Capturing CUDA graphs[^|]*\|[^|]*\| [0-9]+/[0-9]+ \[[^]]*\]|Graph capturing finished.*" | tail -6
  for p in $d/pass*.json; do python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], round(r['output_throughput']), round(r['median_tpot_ms'],3), round(r['p99_ttft_ms']))" $p; done
done
