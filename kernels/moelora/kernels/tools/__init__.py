"""Tuning and benchmark tools of the kernels: `python -m moelora.kernels.tools.bench`, `.tune`, `.tune_dense`, and
vLLM's tuned-config format (vllm_configs). They import the runtime (the rest of moelora.kernels), never the other
way, and are left out of the built wheel: they run from a source checkout."""
