"""The moelora vLLM general plugin (entry point group `vllm.general_plugins`)."""


def register() -> None:
    """Called by vLLM in every process at start-up; swaps in moelora's fused MoE-LoRA kernel when asked to."""
