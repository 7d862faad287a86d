# Calls 6 to 8, a second machine: vLLM's base fused-MoE GEMMs alone, vLLM's choice against the shipped H200 entry.
# The archive without flash-attention's library, openai_harmony and llguidance (to fit one carry beside the tree);
# call 6 lacked image:operator on PYTHONPATH, call 7 openai_harmony, which vLLM's config imports and this never
# calls: call 8 stood in a module that answers any name with an empty class.
T=$(date +%s); mkdir -p /tmp/vs && tar -xJf .bundle/q/small.tar.xz -C /tmp/vs
for m in openai_harmony llguidance; do mkdir -p /tmp/stub/$m; printf 'def __getattr__(name):\n    if name.startswith("__"):\n        raise AttributeError(name)\n    return type(name, (), {})\n' > /tmp/stub/$m/__init__.py; done
PYTHONPATH=kernels:image:operator:/tmp/vs:/tmp/stub timeout 170 python3 .bundle/q/base_cfg.py 16 64 2>&1 | grep -v "WARNING\|Warning\|warn(" | tail -12 | tee $OUT/base_cfg.md
