#!/usr/bin/env bash
# vLLM's dense LoRA configs (attention q/k/v, o and router projections) for the H200 library, resumable.
# Usage, from the repo root on a CUDA machine where vLLM imports: bash kernels/scripts/tune_dense_h200.sh OUTPUT_DIR
# VLLM_SITE_ARCHIVE (optional): a tar of a site-packages folder holding vLLM, unpacked under TMPDIR and put on
# PYTHONPATH, for a machine where vLLM is not installed. DRY_RUN=1 prints the plan only.
#
# It resumes from kernels/scripts/tune_dense_state_h200.json (every bucket measured so far, with default and tuned
# times), so each run adds buckets within its DENSE_S timeout; the whole grid is ~650 buckets, several runs. The
# defaults take the buckets that matter most first (MODELS, RANKS, MAX_LORAS, MS override them).
# Afterwards: copy OUTPUT_DIR/dense/<GPU>_{SHRINK,EXPAND_TRUE}.json into kernels/moelora/kernels/configs/<GPU>/ and
# OUTPUT_DIR/dense/tune_dense_state.json over kernels/scripts/tune_dense_state_h200.json, and paste
# OUTPUT_DIR/tune_dense_table.md into docs/benchmarks.md. PACK=1 leaves dense/ and the table as one archive,
# OUTPUT_DIR/dense.tgz, for copying them off a remote machine.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:?usage: tune_dense_h200.sh OUTPUT_DIR}; DIR="$OUT/dense"; mkdir -p "$DIR"
PY=${PYTHON:-python3}
STATE=kernels/scripts/tune_dense_state_h200.json
[ -f "$DIR/tune_dense_state.json" ] || cp "$STATE" "$DIR/tune_dense_state.json"
if [ -n "${VLLM_SITE_ARCHIVE:-}" ]; then
  SITE=${TMPDIR:-/tmp}/vllm-site
  if [ ! -f "$SITE/.done" ]; then
    mkdir -p "$SITE" && "$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
      "$VLLM_SITE_ARCHIVE" "$SITE" && touch "$SITE/.done" || { echo "cannot unpack $VLLM_SITE_ARCHIVE"; exit 3; }
  fi
  export PYTHONPATH=$PYTHONPATH:$SITE
fi
models=()
for m in ${MODELS:-gpt-oss-20b qwen3-30b-a3b}; do models+=(--model "$m"); done
args=("${models[@]}" --ranks "${RANKS:-32,16,64}" --max-loras "${MAX_LORAS:-8,4,1}" --m "${MS:-1,16,32,64,256,1024,4096,8192}"
      --passes "${PASSES:-2}" --output "$DIR")
"$PY" -m moelora.kernels.tools.tune_dense "${args[@]}" --dry-run > "$OUT/dense_plan.txt" && head -3 "$OUT/dense_plan.txt"
[ -n "${DRY_RUN:-}" ] && exit 0
timeout "${DENSE_S:-540}" "$PY" -m moelora.kernels.tools.tune_dense "${args[@]}" 2>&1 | tee "$OUT/tune_dense.log" | grep -v '^    '
"$PY" -m moelora.kernels.tools.tune_dense --report --output "$DIR" > "$OUT/tune_dense_table.md"
if [ -n "${PACK:-}" ]; then
  tar -czf "$OUT/dense.tgz" -C "$OUT" dense tune_dense_table.md && rm -rf "$DIR" && echo "wrote $OUT/dense.tgz"
fi
