#!/usr/bin/env bash
# The bundled H200 library of issue 5, in one device call: our kernel's configs and vLLM's tuned-config files for
# NVIDIA H200 x {GPT-OSS-20B, Qwen3-30B-A3B} x rank {16,32,64} x max_loras {1,4,8} x M {1,16,64,256,1024}.
#
#   run(kind="nvidia-h200", timeout_s=600, command="OUT=$OUT bash kernels/scripts/tune_h200.sh")
#
# Plan (the --dry-run below prints it): 180 buckets per kernel (2 models x 3 ranks x 3 max_loras x 5 M x 2 ops);
# one coordinate-descent pass = 17 candidates per bucket for ours (3060) and 15 for vLLM's op (2700). Measured on an
# H200 (2026-11-29): ours 152 buckets in the 370 s stage (~2.4 s a bucket, compiles included), vLLM's 136 buckets
# in 149 s; so two calls with RESUME make the whole library.
# Each stage has its own timeout inside the 600 s call (ours first: it is what gets bundled); everything is
# resumable, so if a stage stops early, run the same command again with RESUME set to the fetched $OUT/tune folder
# (or carry it) and only the missing buckets are measured.
#
# vLLM's own op is timed only where vLLM imports: set VLLM_SITE_ARCHIVE to the vllm-site.tar.xz built by
# ../shared/tools/vllm-h200/build_bundle.sh (vLLM 0.26.0, the H200 kit's release; carry it, ~61 MiB). Without it
# the vLLM stage reports "vllm not importable" and writes no vLLM files.
#
# Afterwards: untar $OUT/tune.tgz, fold tune/configs/NVIDIA_H200.json into the bundled table with
# kernels/scripts/merge_configs.py, copy the four NVIDIA_H200_FUSED_MOE_LORA_*.json files into
# kernels/moelora/kernels/configs/NVIDIA_H200/ (where the operator's `auto` kernel configs read them), re-run the
# kernel benchmark, and paste $OUT/tune_table.md into docs/benchmarks.md (Tuner).
# DRY_RUN=1 prints the plan only (works on a CPU machine too).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/moelora-out}; DIR="$OUT/tune"; mkdir -p "$DIR"
PY=${PYTHON:-python3}
if [ -n "${RESUME:-}" ] && [ -f "$RESUME/tune_state.json" ] && [ ! -f "$DIR/tune_state.json" ]; then
  cp "$RESUME/tune_state.json" "$DIR/" && echo "resuming from $RESUME/tune_state.json"
fi
if [ -n "${VLLM_SITE_ARCHIVE:-}" ]; then
  SITE=/tmp/vllm-site
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
# One archive: the device tool fetches only a few files per call, and it once dropped tune_state.json.
tar -czf "$OUT/tune.tgz" -C "$OUT" tune && rm -rf "$DIR" && echo "wrote $OUT/tune.tgz (RESUME= its tune/ folder)"
