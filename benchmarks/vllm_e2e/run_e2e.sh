#!/bin/bash
# Plugin check (fail fast), then the benchmark kit's end-to-end bench with the plugin, with tuned configs only (when
# kernels/moelora/kernels/configs/NVIDIA_H200/ has files), and stock vLLM; a summary table in OUTPUT_DIR/summary.md.
# Usage, from the repo root on a CUDA machine: bash benchmarks/vllm_e2e/run_e2e.sh OUTPUT_DIR
# Needs the benchmark kit and its vLLM archive (benchmarks/vllm_e2e/README.md): KIT (default .bundle/kit) and
# VLLM_ARCHIVE (default .bundle/vllm-site.tar.xz).
# Env: NP (prompts, default 128), RUNS (default "plugin stock tuned"), STEP_S (timeout per bench, default 260),
# BUDGET_S (the whole run's time, default 590), CHECK_ARGS (more arguments of check_plugin.py).
set -uo pipefail
R=$(pwd); KIT=${KIT:-$R/.bundle/kit}; ARCH=${VLLM_ARCHIVE:-$R/.bundle/vllm-site.tar.xz}
OUT=${1:?usage: run_e2e.sh OUTPUT_DIR}; mkdir -p "$OUT"; NP=${NP:-128}
RUNS=${RUNS:-plugin stock tuned}; STEP_S=${STEP_S:-260}; SITE=${SITE:-/tmp/vllm-site}; T0=$(date +%s)
log(){ echo "[$(( $(date +%s)-T0 ))s] $*"; }
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
mkdir -p $SITE && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" $ARCH $SITE && touch $SITE/.done || exit 3
log unpacked
python3 benchmarks/vllm_e2e/make_entry_point.py /tmp/moelora-ep
PLUG=$R/image:$R/kernels:$R/operator:/tmp/moelora-ep
CHECK=skipped
if [[ " $RUNS " == *" plugin "* ]]; then  # the check only gates the plugin run
  PYTHONPATH=$PLUG:$SITE VLLM_PLUGINS=moelora MOELORA_KERNEL=moelora timeout 150 python3 benchmarks/vllm_e2e/check_plugin.py ${CHECK_ARGS:-} \
    --json $OUT/check_plugin.json 2>&1 | grep -v "^INFO\|^WARNING\|^DEBUG" | tee $OUT/check_plugin.txt
  CHECK=${PIPESTATUS[0]}; log "plugin check rc=$CHECK"
fi
CFG=$R/kernels/moelora/kernels/configs/NVIDIA_H200
for run in $RUNS; do
  left=$(( ${BUDGET_S:-590} - ($(date +%s) - T0) ))
  [ $left -gt 150 ] || { log "skip $run: ${left}s left"; continue; }
  [ $left -lt $STEP_S ] && step=$left || step=$STEP_S
  case $run in
    plugin) [ "$CHECK" = 0 ] || { log "skip plugin bench: check failed"; continue; }
            env EXTRA_PYTHONPATH=$PLUG VLLM_PLUGINS=moelora MOELORA_KERNEL=moelora \
              timeout $step bash $KIT/run_bench.sh $ARCH $OUT/plugin bf16 $NP lora ;;
    tuned)  [ -n "$(ls $CFG/*.json 2>/dev/null)" ] || { log "skip tuned: no configs in $CFG"; continue; }
            env VLLM_TUNED_CONFIG_FOLDER=$CFG timeout $step bash $KIT/run_bench.sh $ARCH $OUT/tuned bf16 $NP lora ;;
    stock)  timeout $step bash $KIT/run_bench.sh $ARCH $OUT/stock bf16 $NP lora ;;
  esac
  log "$run done rc=$?"; sleep 3  # timeout signals run_bench.sh's whole process group, its server included
done
rm -f $OUT/*/smoke.txt $OUT/check_plugin.txt
for f in $OUT/*/server_*.log; do [ -f "$f" ] && tail -c 4000000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"; done
python3 benchmarks/vllm_e2e/summarize.py $OUT | tee $OUT/summary.md
