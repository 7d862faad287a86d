# `bench_dense --beside` on the bare image: no vLLM archive, pydantic carried as wheels (.bundle/q/wheels); the table
# in $OUT/bench_beside.md. Env: MODELS, MS, BENCH_S.
T=$(date +%s); nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd .bundle/q/wheels/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/pyd:kernels:image:operator PYTHONUNBUFFERED=1 timeout "${BENCH_S:-480}" python3 -m \
  moelora.kernels.tools.bench_dense --beside --models "${MODELS:-qwen3-30b-a3b,gpt-oss-20b}" --m "${MS:-16,64}" 2>&1 \
  | tee "$OUT/bench_beside.md"
echo "after $(( $(date +%s) - T )) s"
