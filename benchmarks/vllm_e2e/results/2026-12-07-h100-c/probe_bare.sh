# The MoE fold probe (moelora.kernels.tools.moe_fold_probe): pydantic carried as wheels, the H200's tables served under
# this GPU's name; on a machine where an earlier call unpacked the vLLM archive (/tmp/vllm-site) vLLM's own GEMM is
# timed too; the archive's first half parked in /tmp for later calls. Env: MODELS, MS, PROBE_S.
T=$(date +%s); [ -f .bundle/a/part.aa ] && cp .bundle/a/part.aa /tmp/part.aa
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; bash .bundle/q/names.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pyd .bundle/q/wheels/*.whl 2>&1 | tail -2
P=/tmp/pyd:kernels:image:operator; [ -f /tmp/vllm-site/.done ] && P=$P:/tmp/vllm-site
PYTHONPATH=$P PYTHONUNBUFFERED=1 timeout "${PROBE_S:-420}" python3 -m moelora.kernels.tools.moe_fold_probe \
  --models "${MODELS:-qwen3,gpt-oss}" --m "${MS:-16,64,1600,8192}" 2>&1 | tee "$OUT/moe_fold_probe.md"
echo "after $(( $(date +%s) - T )) s"
