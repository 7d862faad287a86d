#!/bin/bash
# Side by side in one call: one fresh server per mode (serve_passes.sh, same model, kit flags and load), then one
# table of every pass with each row's median TPOT and output tokens/s against the first mode's first pass.
# Usage, from the repo root on a CUDA machine: bash benchmarks/vllm_e2e/compare.sh OUTPUT_DIR
# Env: MODEL (gpt-oss | gpt-oss-mxfp4 | qwen3), MODES (default "nolora nolora-tuned plugin"), PASSES (default 1), BUDGET_S (the
# whole run, default 585: a mode that cannot finish is not started), MODE_S (the least time a mode needs, default 200).
# MODES takes plugin-ROUTING too (plugin-decode: MOELORA_ROUTING=decode), and MODE.N (e.g. plugin-decode.2): the same
# server again. PLUGIN_S: the least time a plugin mode needs (default MODE_S). CACHE_ROOT: each server keeps vLLM's
# and Triton's caches where spec.kernels.compileCache puts them (VLLM_CACHE_ROOT, TRITON_CACHE_DIR), one folder per
# MODEL and server kind (nolora, nolora-tuned, plugin), so a second server of a kind starts as a second pod through
# compileCache; inductor's scratch cache is the server's own, as a pod's /tmp. Plugin servers run with vLLM's dual
# LoRA stream, as the operator deploys them. Results in OUTPUT_DIR/<MODEL>-<MODE>/, the table in
# OUTPUT_DIR/compare-<MODEL>.md; server logs are cut to their kernel-config and moelora lines (kernel_lines.txt,
# moelora_lines.txt) and their start-up timings (startup_lines.txt). PLUGIN_ARGS: more vLLM flags for plugin servers
# only (e.g. --lora-target-modules ...); PROFILE=plugin profiles plugin servers only, PROFILE=MODE (without .N) that
# mode's servers only, PROFILE=1 every server.
# DUAL_STREAM=0: plugin servers without vLLM's dual LoRA stream (an experiment; the operator deploys it on).
# VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random (vLLM's own, inherited by every server): experts drawn uniformly
# per token instead of by the dummy weights' router, which sends nearly every token to the same few experts. vLLM
# hashes it into torch.compile's cache key: a second pod reuses only a first pod's cache made with the same value.
# PLUGIN_ENV: more environment for plugin servers (e.g. MOELORA_STREAM_MAX_TOKENS=100000: the second stream at every
# size, as before lora_stream); PLUGIN_ENV_<N>: more for the server of mode plugin.N only, so one call compares two
# settings on one machine (e.g. MODES="plugin.2 plugin.3" PLUGIN_ENV_3=MOELORA_STREAM_MAX_TOKENS=100000); PLUGIN_ARGS_<N>
# the same for vLLM flags. BASE_PASS=1 (serve_passes.sh): servers with adapters run a base-model pass too (row "base").
# ADAPTERS=runtime (serve_passes.sh): adapters loaded through vLLM's runtime API after the server answers, as the agent
# loads them; the table's last column is then when the last one was in.
set -u
R=$(pwd); OUT=${1:?usage: compare.sh OUTPUT_DIR}; MODEL=${MODEL:-gpt-oss}; T0=$(date +%s); export MODEL
mkdir -p "$OUT"
for mode in ${MODES:-nolora nolora-tuned plugin}; do
  left=$(( ${BUDGET_S:-585} - ($(date +%s) - T0) )); need=${MODE_S:-200}; base=${mode%.[0-9]}
  case $base in plugin*) need=${PLUGIN_S:-$need} ;; esac
  [ $left -gt $need ] || { echo "skip $mode: ${left}s left"; continue; }
  # plugin-ROUTING (e.g. plugin-decode): the plugin with MOELORA_ROUTING=ROUTING, so two routings fit one table.
  extra=""; kind=$base; plugin_args=""
  case $base in plugin*) kind=plugin; extra="VLLM_LORA_ENABLE_DUAL_STREAM=${DUAL_STREAM:-1} ${PLUGIN_ENV:-}"
    plugin_args=${PLUGIN_ARGS:-}; [ "$base" = plugin ] || extra="$extra MOELORA_ROUTING=${base#plugin-}"
    # plugin.N: PLUGIN_ENV_N and PLUGIN_ARGS_N too.
    [ "$mode" = "$base" ] || { env_n=PLUGIN_ENV_${mode##*.}; args_n=PLUGIN_ARGS_${mode##*.}
      extra="$extra ${!env_n:-}"; plugin_args="$plugin_args ${!args_n:-}"; } ;; esac
  cache=""
  if [ -n "${CACHE_ROOT:-}" ]; then
    cache=$CACHE_ROOT/$MODEL-$kind; mkdir -p "$cache/vllm" "$cache/triton" "$OUT/$MODEL-$mode"
    extra="$extra VLLM_CACHE_ROOT=$cache/vllm TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)"
    ls "$cache/triton" > "$OUT/$MODEL-$mode/cache_before.txt"
  fi
  args="${SERVER_ARGS:-} $plugin_args"; prof=${PROFILE:-0}
  case $prof in 1) ;; plugin) [ $kind = plugin ] && prof=1 || prof=0 ;; "$base") prof=1 ;; *) prof=0 ;; esac
  MODE=$kind PASSES=${PASSES:-1} PASS_S=150 EXTRA_ENV="$extra" SERVER_ARGS="$args" PROFILE=$prof timeout $((left - 5)) \
    bash benchmarks/vllm_e2e/serve_passes.sh "$OUT" "$MODEL-$mode"
  for _ in $(seq 1 30); do  # the next server needs the memory this one held
    [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)" -lt 2000 ] && break; sleep 1
  done
  log=$OUT/$MODEL-$mode/server.log
  # What this server added to the compile cache: a second pod that found everything adds nothing.
  [ -n "$cache" ] && ls "$cache/triton" | sort | comm -13 <(sort "$OUT/$MODEL-$mode/cache_before.txt") - \
    | while read -r d; do ls "$cache/triton/$d" | grep -v '^__grp__'; done | grep '\.json$' | sort | uniq -c \
    > "$OUT/$MODEL-$mode/cache_new.txt"
  [ -f "$log" ] && grep -E "Using .*MoE|MoE config|LoRA kernel config|moelora: (fused|model warm)|Error|error:" "$log" \
    | cut -c1-300 | sort -u | head -20 > "$OUT/$MODEL-$mode/kernel_lines.txt"
  # The plugin's lines (warm-ups; with MOELORA_LOG_COMPILES=1 every Triton compile), vLLM's own warning for a JIT
  # compile after its warm-up (its jit_monitor: "... during inference: <kernel>", once per kernel) and the line where
  # serving began, so a compile under the first requests shows after "Application startup complete".
  [ -f "$log" ] && grep -nE "moelora:|during inference:|Application startup complete" "$log" | cut -c1-400 | head -600 \
    > "$OUT/$MODEL-$mode/moelora_lines.txt"
  # Where the start-up went (weights, torch.compile, profiling, graph capture, warm-ups), in the log's order.
  [ -f "$log" ] && grep -E " took | takes |finished in|warm-up ran|Starting to load|Application startup complete" \
    "$log" | cut -c1-300 | head -40 > "$OUT/$MODEL-$mode/startup_lines.txt"
  [ -f "$log" ] && gzip -9f "$log"  # the whole log's timestamps: where the start-up went
done
python3 - "$OUT" "$MODEL" "${MODES:-nolora nolora-tuned plugin}" <<'PY' | tee "$OUT/compare-$MODEL.md"
import json, pathlib, sys
out, model, modes = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3].split()
print("| server | pass | output tok/s | median TPOT ms | p99 TPOT ms | median TTFT ms | p99 TTFT ms | TPOT / first | tok/s / first | ready after s | adapters in after s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
base = None
for mode in modes:
    d = out / f"{model}-{mode}"
    ready = (d / "ready_s.txt").read_text().strip() if (d / "ready_s.txt").exists() else "-"
    loaded = (d / "adapters_s.txt").read_text().strip() if (d / "adapters_s.txt").exists() else "-"
    for p in sorted(d.glob("pass*.json")):
        r = json.loads(p.read_text())
        base = base or r
        print(f"| {mode} | {p.stem[4:]} | {r['output_throughput']:.0f} | {r['median_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} | "
              f"{r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} | {r['median_tpot_ms'] / base['median_tpot_ms']:.3f} | "
              f"{r['output_throughput'] / base['output_throughput']:.3f} | {ready} | {loaded} |")
PY
