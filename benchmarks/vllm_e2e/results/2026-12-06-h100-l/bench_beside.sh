# The machine set up as qwen3_h100.sh sets it up (vLLM unpacked to /tmp/vllm-site, byte-compiled, imported once), then
# the split-K dense LoRA beside the base GEMM (`bench_dense --beside`), its table in $OUT/bench_beside.md; the
# servers of qwen3_h100.sh can follow in the next call. Needs call1.sh's /tmp/part.aa. Env: MODELS, MS, BENCH_S.
T=$(date +%s); SITE=/tmp/vllm-site
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
if [ ! -f $SITE/.done ]; then
  mkdir -p $SITE && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
    /tmp/vllm-site.tar.xz $SITE || exit 3
  python3 -m compileall -q -j 16 $SITE image kernels > /dev/null 2>&1
  PYTHONPATH=$SITE timeout 120 python3 -c "import torch; torch.zeros(1).cuda(); import vllm.entrypoints.openai.api_server" \
    > /dev/null 2>&1
  touch $SITE/.done; echo "machine set up in $(( $(date +%s) - T )) s"
fi
PYTHONPATH=$SITE:kernels:image:operator timeout "${BENCH_S:-420}" python3 -m moelora.kernels.tools.bench_dense --beside \
  --models "${MODELS:-qwen3-30b-a3b,gpt-oss-20b}" --m "${MS:-16,64}" 2>&1 | tee "$OUT/bench_beside.md"
echo "after $(( $(date +%s) - T )) s"
