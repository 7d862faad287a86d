#!/bin/bash
# The device bundle, .bundle/ (ignored by git, so a fresh checkout lacks it), rebuilt from the kit and the latest
# runs' scripts. The kit's vLLM archive and the tree do not fit one carry together, so it travels in halves:
#   a: the archive's first half and call1.sh (parks the half in /tmp, runs the capture-pin GPU tests);
#   b: the second half, the kit, names.sh (serves the H200's tables under another GPU's name);
#   q: the call scripts (qwen3_h100.sh: Qwen3, STAGE=cold then STAGE=second, QWEN3_LAYERS=48 for the whole model on
#      an H200, where a cold plugin server takes about 7 minutes: cold no LoRA in the next call, as in
#      results/2026-12-06-h200-q/calls.txt; gptoss_startup.sh and gptoss_uniform2.sh: GPT-OSS, experts drawn uniformly;
#      capture_probe.sh and one_graph.sh: Qwen3 at 8 layers, start-ups profiled and one CUDA graph per size;
#      auto.sh: qwen3_h100.sh at the whole depth on an H200, half on an H100; bench_beside.sh: the machine set up,
#      then `bench_dense --beside`; bench_bare.sh: the same bench on the bare image, carry [".bundle/q"] alone, with
#      pydantic's wheels in q/wheels; probe_bare.sh and probe_site.sh: the MoE fold probe, bare and beside vLLM's GEMM;
#      bench_headline.sh: `bench` on the bare image; gptoss_pair.sh: GPT-OSS, both kinds cold, then as second pods;
#      int8_kernels.sh: the int8 GPU tests and `bench --weights int8` beside the bf16 baseline, from call 1's carry).
# Device calls: carry [".bundle/a"] `bash .bundle/a/call1.sh`, then carry [".bundle/b", ".bundle/q"] and a script.
# Usage, from the repo root: bash benchmarks/vllm_e2e/make_bundle.sh [KIT_DIR] (default ../shared/tools/vllm-h200;
# about 4 minutes when the archive is built, which an existing .bundle/a and .bundle/b skip).
set -euo pipefail
KIT=$(cd "${1:-../shared/tools/vllm-h200}" && pwd); B=.bundle; RES=benchmarks/vllm_e2e/results
mkdir -p $B/a $B/b/kit $B/q
if [ ! -f $B/a/part.aa ] || [ ! -f $B/b/part.ab ]; then
  W=$(mktemp -d); bash "$KIT/build_bundle.sh" "$W" > "$W/build.log" 2>&1 || { tail -20 "$W/build.log"; exit 3; }
  split -b 32M "$W/vllm-site.tar.xz" "$W/part."; mv "$W/part.aa" $B/a/; mv "$W/part.ab" $B/b/; rm -rf "$W"
fi
cp "$KIT"/*.py "$KIT"/*.sh "$KIT/pins.txt" $B/b/kit/
cp $RES/2026-12-05-h100-c/call1.sh $B/a/
cp $RES/2026-12-05-h100-b/names.sh $B/b/
cp $RES/2026-12-06-h100-i/qwen3_h100.sh $RES/2026-12-06-h100-h/gptoss_uniform2.sh $B/q/
cp $RES/2026-12-06-h100-g/call2.sh $B/q/gptoss_startup.sh
cp $RES/2026-12-06-h100-j/capture_probe.sh $RES/2026-12-06-h100-j/one_graph.sh $RES/2026-12-06-h100-k/auto.sh $B/q/
cp $RES/2026-12-06-h100-l/bench_beside.sh $RES/2026-12-07-h100-a/bench_bare.sh $B/q/
cp $RES/2026-12-07-h100-c/probe_bare.sh $RES/2026-12-07-h100-c/probe_site.sh $B/b/names.sh $B/q/
cp $RES/2026-12-07-h100-d/bench_headline.sh $RES/2026-12-07-h100-d/gptoss_pair.sh $RES/2026-12-07-h100-e/int8_kernels.sh $B/q/
# The device image's Python (3.12) has no pydantic, which moelora.api (imported by the kernel tools) needs.
[ -d $B/q/wheels ] || python3 -m pip download -q pydantic==2.14.4 --platform manylinux2014_x86_64 --python-version 3.12 \
  --only-binary=:all: -d $B/q/wheels
rm -f $B/q/wheels/typing_extensions-*
du -sh $B/a $B/b $B/q
