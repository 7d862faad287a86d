# Qwen3-30B-A3B at part of its depth (QWEN3_LAYERS, default 24 of 48: the whole model and 8 adapters do not fit an
# H100) on one H100, experts drawn uniformly, the operator's --lora-target-modules, adapters through vLLM's runtime
# API after the server answers (as the agent loads them), NP prompts (default 64).
# STAGE=cold: the archive set up, the model and its adapters made, then cold servers (MODES, default "plugin nolora"),
#   start-up only unless PASSES is set; they leave the compile caches the second pods read.
# STAGE=second: both kinds again as second pods from those caches (MODES, default "nolora.2 plugin.2"), a pass each.
# Needs call1.sh's /tmp/part.aa. LIMIT: the call's seconds (default 592).
T=$(date +%s); bash .bundle/b/names.sh > /dev/null
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
export ADAPTERS=${ADAPTERS:-runtime} QWEN3_LAYERS=${QWEN3_LAYERS:-24} NP=${NP:-64} SITE=/tmp/vllm-site
export VLLM_ARCHIVE=/tmp/vllm-site.tar.xz KIT=$PWD/.bundle/b/kit MODEL=qwen3 VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random
export PLUGIN_ARGS="--lora-target-modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj experts"
case ${STAGE:?STAGE=cold or STAGE=second} in
  cold) export PASSES=${PASSES:-0}; MODES=${MODES:-plugin nolora}; PS=${PLUGIN_S:-150}; MS=${MODE_S:-90} ;;
  second) export PASSES=${PASSES:-1}; MODES=${MODES:-nolora.2 plugin.2}; PS=${PLUGIN_S:-170}; MS=${MODE_S:-130} ;;
  *) echo "STAGE=cold or STAGE=second"; exit 2 ;;
esac
# The machine's set-up as h200_call.sh does it, here so that the model and adapters are made before any server's
# clock starts (serve_passes.sh would make them inside the first mode's time).
if [ ! -f $SITE/.done ]; then
  mkdir -p $SITE && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
    $VLLM_ARCHIVE $SITE || exit 3
  python3 -m compileall -q -j 16 $SITE image kernels > /dev/null 2>&1
  PYTHONPATH=$SITE timeout 120 python3 -c "import torch; torch.zeros(1).cuda(); import vllm.entrypoints.openai.api_server" \
    > /dev/null 2>&1
  touch $SITE/.done; echo "machine set up in $(( $(date +%s) - T )) s"
fi
M=/tmp/m_qwen3_l$QWEN3_LAYERS; L=/tmp/loras_qwen3_l$QWEN3_LAYERS; CUT=(--layers $QWEN3_LAYERS)
[ -d $M ] || PYTHONPATH=$SITE python3 benchmarks/vllm_e2e/make_qwen3.py model $M "${CUT[@]}" > /dev/null || exit 5
[ -d $L ] || PYTHONPATH=$SITE python3 benchmarks/vllm_e2e/make_qwen3.py loras $L 8 32 --device cuda "${CUT[@]}" > /dev/null || exit 5
echo "model and adapters after $(( $(date +%s) - T )) s: $(du -sh $L | cut -f1)"
MODES="$MODES" PLUGIN_S=$PS MODE_S=$MS CALL_S=$(( ${LIMIT:-592} - ($(date +%s) - T) )) bash benchmarks/vllm_e2e/h200_call.sh "$OUT"
for d in "$OUT"/r/qwen3-*/; do
  echo "== $d ready $(cat $d/ready_s.txt 2>/dev/null) adapters $(cat $d/adapters_s.txt 2>/dev/null)"
  grep -h "warm-up\|during inference" $d/moelora_lines.txt 2>/dev/null | cut -c1-200 | tail -4
done
python3 benchmarks/vllm_e2e/startup.py "$OUT"/r/qwen3-*/ > "$OUT/startup.md" 2>&1
grep -E "ready after|engine process|model warm-up|graph capture|engine init" "$OUT/startup.md"
cat "$OUT"/compare-qwen3.md 2>/dev/null
