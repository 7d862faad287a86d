#!/bin/bash
# One vLLM server (the kit's model, adapters and server flags), then PASSES runs of the kit's bench against it,
# each saved with per-request TTFTs. Pass 1 is the kit's measurement; pass 2 shows what is left once every kernel
# has been compiled and every adapter used. Optionally a short profiled load (PROFILE=1: 16 requests, 1600-token
# prompts, 64 output tokens) whose per-kernel CUDA-time table vLLM's torch profiler writes.
# Usage, from the repo root on a CUDA machine: bash benchmarks/vllm_e2e/serve_passes.sh OUTPUT_DIR NAME
# (results in OUTPUT_DIR/NAME). Needs the benchmark kit and its vLLM archive (benchmarks/vllm_e2e/README.md): KIT
# (default .bundle/kit) and VLLM_ARCHIVE (default .bundle/vllm-site.tar.xz).
# Env: MODE (plugin | tuned | stock | nolora | nolora-tuned: no LoRA, the bundled files mounted, i.e. the tuned base
# fused-MoE configs), MODEL (gpt-oss: the kit's GPT-OSS-20B shape, bf16 | gpt-oss-mxfp4: the same, mxfp4 experts |
# qwen3: make_qwen3.py's Qwen3-30B-A3B shape),
# PASSES (default 2), NP (prompts, default 128), EXTRA_ENV ("K=V ..."), SERVER_ARGS (more vLLM flags, e.g.
# --enable-logging-iteration-details), PASS_S (timeout per pass), CAPTURE_MAX (the largest CUDA-graph batch, default 64:
# a decode step of 16 or 64 sequences replays a graph; the operator leaves vLLM's default, 2 x max-num-seqs), AHEAD=0
# (plugin servers without the plugin's read-ahead of the adapters, which the operator turns on), PROFILE_STARTUP=1
# (plugin servers: engine init, LoRA manager to graph capture, under cProfile in OUTPUT_DIR/NAME/startup_profile;
# PROFILE_STARTUP=graph-capture: from the first capture phase, so a cold start's compile is not profiled),
# ITERATIONS=0 (no per-step lines: by default vLLM logs each step's token counts and time, kept in iterations.txt
# for iterations.py), SERVED_CHECK=1 (greedy answers of the base model and each adapter in OUTPUT_DIR/NAME/served.json,
# before the passes: served_check.py), BASE_PASS=1 (a server with adapters: one more pass asking the base model
# only, in passbase.json: what serving adapters costs requests without one, e.g. under one CUDA graph per size),
# ADAPTERS=runtime (a server with adapters: none named on vLLM's command line, which the operator refuses; each loaded
# through vLLM's runtime API once the server answers, one after another as the agent does, so ready_s.txt is when the
# pod answers and adapters_s.txt when its last adapter is in; each load's seconds in adapter_loads.txt).
set -uo pipefail
R=$(pwd); KIT=${KIT:-$R/.bundle/kit}; ARCH=${VLLM_ARCHIVE:-$R/.bundle/vllm-site.tar.xz}; SITE=${SITE:-/tmp/vllm-site}
NAME=${2:?usage: serve_passes.sh OUTPUT_DIR NAME}; MODE=${MODE:-plugin}; PASSES=${PASSES:-2}; NP=${NP:-128}
OUTD=${1:?usage: serve_passes.sh OUTPUT_DIR NAME}/$NAME; mkdir -p $OUTD
T0=$(date +%s); log(){ echo "[$NAME $(( $(date +%s)-T0 ))s] $*"; }
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export CUDA_CACHE_MAXSIZE=4294967296
if [ ! -f $SITE/.done ]; then
  mkdir -p $SITE && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" $ARCH $SITE && touch $SITE/.done || exit 3
fi
[ -d /tmp/moelora-ep ] || python3 benchmarks/vllm_e2e/make_entry_point.py /tmp/moelora-ep >/dev/null
case ${MODEL:-gpt-oss} in
  gpt-oss) M=/tmp/m_bf16; L=/tmp/loras; SERVED=gpt-oss-20b
           [ -d $M ] || PYTHONPATH=$SITE python3 $KIT/make_model_dir.py $M
           [ -d $L ] || PYTHONPATH=$SITE python3 $KIT/make_loras.py $L 8 32 --device cuda ;;
  gpt-oss-mxfp4) M=/tmp/m_mxfp4; L=/tmp/loras; SERVED=gpt-oss-20b
           [ -d $M ] || PYTHONPATH=$SITE python3 $KIT/make_model_dir.py $M --mxfp4
           [ -d $L ] || PYTHONPATH=$SITE python3 $KIT/make_loras.py $L 8 32 --device cuda ;;
  # QWEN3_LAYERS=N: the first N of its 48 layers (all of them and 8 adapters do not fit an H100's memory).
  qwen3)   M=/tmp/m_qwen3; L=/tmp/loras_qwen3; SERVED=qwen3-30b-a3b; CUT=()
           if [ -n "${QWEN3_LAYERS:-}" ]; then M=${M}_l$QWEN3_LAYERS; L=${L}_l$QWEN3_LAYERS; CUT=(--layers "$QWEN3_LAYERS"); fi
           [ -d $M ] || PYTHONPATH=$SITE python3 $R/benchmarks/vllm_e2e/make_qwen3.py model $M "${CUT[@]}" || exit 2
           [ "$MODE" = nolora ] || [ "$MODE" = nolora-tuned ] || [ -d $L ] || \
             PYTHONPATH=$SITE python3 $R/benchmarks/vllm_e2e/make_qwen3.py loras $L 8 32 --device cuda "${CUT[@]}" || exit 2 ;;
  *) log "unknown MODEL ${MODEL}"; exit 2 ;;
esac
CFG=$R/kernels/moelora/kernels/configs/NVIDIA_H200
LM=""; NAMES=""; for i in $(seq 1 8); do LM="$LM lora$i=$L/lora$i"; NAMES="$NAMES lora$i"; done
SRV_LORA="--enable-lora --max-loras 8 --max-cpu-loras 8 --max-lora-rank 32 --lora-modules $LM"
BENCH_LORA="--lora-modules $NAMES --lora-assignment round-robin"
PP=$SITE; ENVS=""
case $MODE in
  plugin) PP=$R/image:$R/kernels:$R/operator:/tmp/moelora-ep:$SITE; ENVS="VLLM_PLUGINS=moelora MOELORA_KERNEL=moelora VLLM_TUNED_CONFIG_FOLDER=$CFG"
          # The adapters' directory for the plugin's read-ahead, as the operator renders it (AHEAD=0: none).
          [ "${AHEAD:-1}" = 0 ] || ENVS="$ENVS MOELORA_ADAPTERS_AHEAD_DIR=$L"
          [ "${PROFILE_STARTUP:-0}" = 0 ] || ENVS="$ENVS MOELORA_PROFILE_STARTUP=$OUTD/startup_profile"
          [ "${PROFILE_STARTUP:-0}" = graph-capture ] && ENVS="$ENVS MOELORA_PROFILE_STARTUP_FROM=graph-capture" ;;
  tuned)  ENVS="VLLM_TUNED_CONFIG_FOLDER=$CFG" ;;
  stock)  ;;
  nolora) SRV_LORA=""; BENCH_LORA="" ;;
  nolora-tuned) SRV_LORA=""; BENCH_LORA=""; ENVS="VLLM_TUNED_CONFIG_FOLDER=$CFG" ;;
  *) log "unknown MODE $MODE"; exit 2 ;;
esac
RUNTIME=0; if [ "${ADAPTERS:-startup}" = runtime ] && [ -n "$SRV_LORA" ]; then
  RUNTIME=1; SRV_LORA=${SRV_LORA% --lora-modules*}; ENVS="$ENVS VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
fi
STEPS=""; [ "${ITERATIONS:-1}" = 1 ] && STEPS=--enable-logging-iteration-details
PROF=(); [ "${PROFILE:-0}" = 1 ] && PROF=(--profiler-config "{\"profiler\": \"torch\", \"torch_profiler_dir\": \"$OUTD/prof\", \"torch_profiler_with_stack\": false}")
env PYTHONPATH=$PP $ENVS ${EXTRA_ENV:-} python3 -m vllm.entrypoints.cli.main serve $M --served-model-name $SERVED \
  --load-format dummy $SRV_LORA --max-model-len 4096 --max-num-seqs 64 --max-cudagraph-capture-size ${CAPTURE_MAX:-64} --port 8000 \
  $STEPS ${SERVER_ARGS:-} "${PROF[@]}" > $OUTD/server.log 2>&1 &
SP=$!; TS=$(date +%s); date +%T > $OUTD/launched_at.txt  # the log's clock: where the start-up went
for _ in $(seq 1 400); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null && break
  kill -0 $SP 2>/dev/null || { log "server died"; tail -40 $OUTD/server.log; exit 5; }; sleep 1
done
echo $(( $(date +%s) - TS )) > $OUTD/ready_s.txt; log "server ready after $(cat $OUTD/ready_s.txt) s"
if [ $RUNTIME = 1 ]; then  # the agent's path: each adapter through the runtime API
  PYTHONPATH=$R/local python3 - $L $OUTD/adapter_loads.txt $NAMES <<'PY' || { log "an adapter failed to load"; kill $SP; exit 6; }
import pathlib, sys, time
from moelora.local.vllm_server import load_adapter
where, out, names = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
with open(out, "w") as f:
    for name in names:
        t = time.monotonic()
        load_adapter(url="http://127.0.0.1:8000", name=name, path=where / name, timeout=300)
        f.write(f"{name} {time.monotonic() - t:.2f}\n")
PY
  echo $(( $(date +%s) - TS )) > $OUTD/adapters_s.txt; log "adapters loaded after $(cat $OUTD/adapters_s.txt) s"
fi
if [ "${SERVED_CHECK:-0}" = 1 ]; then  # what the base model and each adapter answer, before any pass
  models=$SERVED; [ -n "$SRV_LORA" ] && models="$models,$(echo $NAMES | tr ' ' ',')"
  timeout 240 python3 $R/benchmarks/vllm_e2e/served_check.py collect http://127.0.0.1:8000 $OUTD/served.json \
    --models $models && log "served answers collected"
fi
# One pass of the kit's load: its name (results in pass<NAME>.json), seed, then the adapters' flags if any;
# pass_steps.txt gets the pass's name and the steps logged by its end (iterations.py splits the steps by pass).
bench_pass() {
  PYTHONPATH=$SITE timeout ${PASS_S:-200} python3 -m vllm.entrypoints.cli.main bench serve --backend vllm \
    --base-url http://127.0.0.1:8000 --model $SERVED --tokenizer $M --dataset-name random --random-input-len 1600 \
    --random-output-len 600 --random-range-ratio 0 --num-prompts $NP --max-concurrency 16 --ignore-eos \
    --num-warmups 16 "${@:3}" --percentile-metrics ttft,tpot,itl,e2el --save-result --save-detailed \
    --result-dir $OUTD --result-filename pass$1.json --seed $2 2>&1 | grep -E "throughput|TTFT|TPOT" | head -8
  echo "pass$1 $(grep -c 'Iteration(' $OUTD/server.log)" >> $OUTD/pass_steps.txt
}
for p in $(seq 1 $PASSES); do
  bench_pass $p $p $BENCH_LORA; log "pass $p done"
done
if [ "${BASE_PASS:-0}" = 1 ] && [ -n "$BENCH_LORA" ]; then
  bench_pass base 1; log "base-model pass done"
fi
if [ ${#PROF[@]} -gt 0 ]; then
  python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:8000/start_profile', method='POST'))"
  PYTHONPATH=$SITE timeout 90 python3 -m vllm.entrypoints.cli.main bench serve --backend vllm \
    --base-url http://127.0.0.1:8000 --model $SERVED --tokenizer $M --dataset-name random --random-input-len 1600 \
    --random-output-len 64 --random-range-ratio 0 --num-prompts 16 --max-concurrency 16 --ignore-eos \
    $BENCH_LORA --seed 99 2>&1 | grep -E "TPOT" | head -3
  python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:8000/stop_profile', method='POST'), timeout=120)"
  log "profile done"
fi
kill $SP; sleep 4
grep -E "moelora|Using .*MoE|LoRA kernel config" $OUTD/server.log | sort -u | head -12
# Keep the per-step lines (ITERATIONS, or --enable-logging-iteration-details in SERVER_ARGS) and cut a long log.
grep -oE "Iteration\([0-9]+\): [0-9]+ context requests, [0-9]+ context tokens, [0-9]+ generation requests, [0-9]+ generation tokens, iteration elapsed time: [0-9.]+" \
  $OUTD/server.log > $OUTD/iterations.txt
grep -v "Iteration(" $OUTD/server.log | tail -c 2000000 > $OUTD/server.tmp && mv $OUTD/server.tmp $OUTD/server.log
log "done"
