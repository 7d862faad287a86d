#!/usr/bin/env bash
# vLLM's base fused-MoE configs (the experts' own GEMMs) for the bundled models on the H200, resumable.
# Usage, from the repo root on a CUDA machine where vLLM imports: bash kernels/scripts/tune_moe_h200.sh OUTPUT_DIR
# VLLM_SITE_ARCHIVE (optional): a tar of a site-packages folder holding vLLM, unpacked under TMPDIR and put on
# PYTHONPATH, for a machine where vLLM is not installed.
# Each model gets its own time budget (GPT_S, QWEN_S seconds, then no new token count is started); counts left out
# hold vLLM's own choice. It resumes from kernels/scripts/tune_moe_state_h200.json (the bundled files' buckets;
# FRESH=1 starts over), so a rerun tunes only the counts left out. Afterwards copy OUTPUT_DIR/moe/E=*.json into
# kernels/moelora/kernels/configs/NVIDIA_H200/, OUTPUT_DIR/moe/tune_moe_state.json over the state file, and paste
# OUTPUT_DIR/tune_moe_table.md into docs/benchmarks.md. It ends by asking vLLM's own lookup which file it reads.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:?usage: tune_moe_h200.sh OUTPUT_DIR}; DIR="$OUT/moe"; mkdir -p "$DIR"
PY=${PYTHON:-python3}
STATE=kernels/scripts/tune_moe_state_h200.json  # the bundled files' state: a rerun tunes only what it left out
[ -f "$DIR/tune_moe_state.json" ] || [ -n "${FRESH:-}" ] || cp "$STATE" "$DIR/tune_moe_state.json"
if [ -n "${VLLM_SITE_ARCHIVE:-}" ]; then
  SITE=${TMPDIR:-/tmp}/vllm-site
  if [ ! -f "$SITE/.done" ]; then
    mkdir -p "$SITE" && "$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
      "$VLLM_SITE_ARCHIVE" "$SITE" && touch "$SITE/.done" || { echo "cannot unpack $VLLM_SITE_ARCHIVE"; exit 3; }
  fi
  export PYTHONPATH=$PYTHONPATH:$SITE
fi
MS=${MS:-16,32,8,1,64,128,256,512,1024,2048,4096,8192}
"$PY" -m moelora.kernels.tools.tune_moe --model gpt-oss-20b --m "$MS" --budget-s "${GPT_S:-200}" --output "$DIR" 2>&1 \
  | tee "$OUT/tune_moe_gpt.log" | grep -v '^    '
"$PY" -m moelora.kernels.tools.tune_moe --model qwen3-30b-a3b --m "$MS" --budget-s "${QWEN_S:-150}" --output "$DIR" 2>&1 \
  | tee "$OUT/tune_moe_qwen.log" | grep -v '^    '
"$PY" -m moelora.kernels.tools.tune_moe --report --output "$DIR" > "$OUT/tune_moe_table.md"
VLLM_TUNED_CONFIG_FOLDER=$(cd "$DIR" && pwd) "$PY" -c "
from vllm.model_executor.layers.fused_moe.fused_moe import get_moe_configs
for e, n in ((32, 2880), (128, 768)):
    print('E=%d N=%d: %d token counts read' % (e, n, len(get_moe_configs(e, n, None) or {})))
" 2>&1 | grep -E "Using|default MoE|token counts"
