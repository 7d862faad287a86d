# The whole Qwen3 on an H200, 24 of its layers on an H100 (the whole model and 8 adapters do not fit one): the rest
# as qwen3_h100.sh takes it.
MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
export QWEN3_LAYERS=${QWEN3_LAYERS:-$([ "$MIB" -gt 100000 ] && echo 48 || echo 24)}
echo "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1): $QWEN3_LAYERS layers"
bash .bundle/q/qwen3_h100.sh
