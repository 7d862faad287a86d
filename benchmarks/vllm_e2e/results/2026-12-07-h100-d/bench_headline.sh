# `python -m moelora.kernels.tools.bench` (the headline: both models, rank 32, 8 adapters, M = 1 to 1600) on the bare
# image, pydantic carried as wheels (.bundle/q/wheels); the archive's first half parked in /tmp for later calls.
# Env: BENCH_S, ROUTE (default: the served routing).
T=$(date +%s); [ -f .bundle/a/part.aa ] && cp .bundle/a/part.aa /tmp/part.aa
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd .bundle/q/wheels/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/pyd:kernels:image:operator PYTHONUNBUFFERED=1 timeout "${BENCH_S:-240}" python3 -m \
  moelora.kernels.tools.bench ${ROUTE:+--route $ROUTE} 2>&1 | tee "$OUT/bench_headline${ROUTE:+_$ROUTE}.md"
echo "after $(( $(date +%s) - T )) s"
