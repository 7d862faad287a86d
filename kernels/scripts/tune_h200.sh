#!/usr/bin/env bash
# The bundled H200 library: our kernel's configs and vLLM's tuned-config files for the GPU it runs on x
# {GPT-OSS-20B, Qwen3-30B-A3B} x rank {16,32,64} x max_loras {1,4,8} x M {1,16,64,256,1024}.
# Usage, from the repo root on a CUDA machine: bash kernels/scripts/tune_h200.sh OUTPUT_DIR
# Writes OUTPUT_DIR/tune/ (the tuner's output and resumable state), the logs and OUTPUT_DIR/tune_table.md.
#
# 180 buckets per kernel (2 models x 3 ranks x 3 max_loras x 5 M x 2 ops); DRY_RUN=1 prints the plan only (a CPU
# machine will do). Each stage has its own timeout (OURS_S, VLLM_S; ours first, as it is what gets bundled) and
# everything is resumable: run the same command again on the same OUTPUT_DIR, or point RESUME at an earlier tune/
# folder, and only the missing buckets are measured (docs/benchmarks.md, Tuner, has how long a bucket takes).
#
# vLLM's own op is timed only where vLLM imports (`import vllm` works in PYTHON's environment), else the vLLM stage
# reports "vllm not importable" and writes no vLLM files. VLLM_SITE_ARCHIVE (optional): a tar of a site-packages
# folder holding vLLM, unpacked under TMPDIR and put on PYTHONPATH, for a machine where vLLM is not installed.
#
# Afterwards: fold tune/configs/<GPU>.json into the bundled table with kernels/scripts/merge_configs.py, copy the
# four <GPU>_FUSED_MOE_LORA_*.json files into kernels/moelora/kernels/configs/<GPU>/ (where the operator's `auto`
# kernel configs read them), re-run the kernel benchmark, and paste tune_table.md into docs/benchmarks.md (Tuner).
# PACK=1 leaves tune/ as one archive, OUTPUT_DIR/tune.tgz, for copying it off a remote machine.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels${PYTHONPATH:+:$PYTHONPATH}
OUT=${1:?usage: tune_h200.sh OUTPUT_DIR}; DIR="$OUT/tune"; mkdir -p "$DIR"
PY=${PYTHON:-python3}
if [ -n "${RESUME:-}" ] && [ -f "$RESUME/tune_state.json" ] && [ ! -f "$DIR/tune_state.json" ]; then
  cp "$RESUME/tune_state.json" "$DIR/" && echo "resuming from $RESUME/tune_state.json"
fi
if [ -n "${VLLM_SITE_ARCHIVE:-}" ]; then
  SITE=${TMPDIR:-/tmp}/vllm-site
  if [ ! -f "$SITE/.done" ]; then
    mkdir -p "$SITE" && "$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
      "$VLLM_SITE_ARCHIVE" "$SITE" && touch "$SITE/.done" || { echo "cannot unpack $VLLM_SITE_ARCHIVE"; exit 3; }
  fi
  export PYTHONPATH=$PYTHONPATH:$SITE VLLM_USE_FLASHINFER_SAMPLER=0
fi
args=(--model gpt-oss-20b --model qwen3-30b-a3b --ranks 16,32,64 --max-loras 1,4,8 --m 1,16,64,256,1024
      --space h200 --passes 1 --output "$DIR")
if [ -n "${DRY_RUN:-}" ]; then
  "$PY" -m moelora.kernels.tools.tune "${args[@]}" --dry-run | sed -n 1,3p
  exit $?
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/smi.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout "${OURS_S:-330}" "$PY" -m moelora.kernels.tools.tune "${args[@]}" --kernels ours 2>&1 | tee "$OUT/tune_ours.log" \
  | grep -v '^    '
timeout "${VLLM_S:-200}" "$PY" -m moelora.kernels.tools.tune "${args[@]}" --kernels vllm 2>&1 | tee "$OUT/tune_vllm.log" \
  | grep -v '^    '
"$PY" -m moelora.kernels.tools.tune --report --output "$DIR" | tee "$OUT/tune_table.md" | tail -3
ls -la "$DIR"
if [ -n "${PACK:-}" ]; then
  tar -czf "$OUT/tune.tgz" -C "$OUT" tune && rm -rf "$DIR" && echo "wrote $OUT/tune.tgz (RESUME= its tune/ folder)"
fi
