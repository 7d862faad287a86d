"""Where the plugin meets vLLM's loading of adapters into host memory, as data (touchpoints.py says how each kind is
checked): adapter_pinning's two pinning passes and the merge they follow, host_adapters' load, manager and clone, and
dummy_loras' warm-up dummy and the start-up warm-up whose end drops it.
Stdlib only, like contract.py.
"""

from __future__ import annotations

from .contract import (
    ADD_DUMMY_LORA_PARAMETERS,
    CAPTURE_PARAMETERS,
    CLONE_PARAMETERS,
    CREATE_LORA_MANAGER_PARAMETERS,
    LOAD_ADAPTER_PARAMETERS,
    MERGE_PARAMETERS,
    MOE_CREATE_PARAMETERS,
    MOE_RESET_LORA_PARAMETERS,
    MOE_SET_LORA_PARAMETERS,
    WARM_UP_PARAMETERS,
    Touchpoint,
)

__all__ = ["ADAPTERS"]

_MODEL_MANAGER = "lora/model_manager.py"
_LORA_MODEL = "lora/lora_model.py"
_WORKER_MANAGER = "lora/worker_manager.py"
_WEIGHTS = "lora/lora_weights.py"
_TORCH_UTILS = ("vllm.utils.torch_utils",)
_A_B = frozenset({"lora_a", "lora_b"})
_PINNING = "adapter_pinning"
_HOST = "host_adapters"
_DUMMY = "dummy_loras"
_FUSED_MOE = "lora/layers/fused_moe.py"
_INT8 = "expert_int8"

ADAPTERS: tuple[Touchpoint, ...] = (
    # ---- adapter_pinning (CUDA): vLLM's two pinning passes over a loaded adapter, and the merge it follows ----
    Touchpoint(
        "LoRAModelManager._create_merged_loras_inplace",
        "params",
        (_MODEL_MANAGER,),
        "LoRAModelManager._create_merged_loras_inplace",
        MERGE_PARAMETERS,
        _PINNING,
    ),
    Touchpoint(
        "every added adapter is merged, then pinned",
        "text",
        (_MODEL_MANAGER,),
        "the merge and its pinning pass",
        ("self._create_merged_loras_inplace(lora)", 'pin_memory = str(lora_device) == "cpu" and PIN_MEMORY'),
        _PINNING,
    ),
    Touchpoint("model_manager binds PIN_MEMORY", "imports", (_MODEL_MANAGER,), "PIN_MEMORY", _TORCH_UTILS, _PINNING),
    Touchpoint(
        "from_lora_tensors pins as it reads",
        "text",
        (_LORA_MODEL,),
        "the per-tensor pinning pass",
        ('pin_memory = str(device) == "cpu" and PIN_MEMORY',),
        _PINNING,
    ),
    Touchpoint("lora_model binds PIN_MEMORY", "imports", (_LORA_MODEL,), "PIN_MEMORY", _TORCH_UTILS, _PINNING),
    Touchpoint(
        "LoRA weights hold lora_a and lora_b", "params", (_WEIGHTS,), "LoRALayerWeights.__init__", _A_B, _PINNING
    ),
    Touchpoint(
        "packed LoRA weights hold lists of them",
        "params",
        (_WEIGHTS,),
        "PackedLoRALayerWeights.__init__",
        _A_B,
        _PINNING,
    ),
    # ---- host_adapters (CUDA): the engine thread's load of an adapter, then its add; the manager; the clone ----
    Touchpoint(
        "WorkerLoRAManager._load_adapter",
        "params",
        (_WORKER_MANAGER,),
        "WorkerLoRAManager._load_adapter",
        LOAD_ADAPTER_PARAMETERS,
        _HOST,
    ),
    Touchpoint(
        "an adapter is loaded, then added to the manager (which merges it)",
        "text",
        (_WORKER_MANAGER,),
        "the worker's add_adapter",
        ("lora = self._load_adapter(lora_request)", "loaded = self._adapter_manager.add_adapter(lora)"),
        _HOST,
    ),
    Touchpoint(
        "LRUCacheWorkerLoRAManager.create_lora_manager",
        "params",
        (_WORKER_MANAGER,),
        "LRUCacheWorkerLoRAManager.create_lora_manager",
        CREATE_LORA_MANAGER_PARAMETERS,
        _HOST,
    ),
    Touchpoint(
        "the model runner creates the LRU worker manager",
        "text",
        ("v1/worker/lora_model_runner_mixin.py",),
        "the runner's LoRA set-up",
        ("LRUCacheWorkerLoRAManager(", ".create_lora_manager(model, vllm_config)"),
        _HOST,
    ),
    Touchpoint("LoRAModel.clone shares tensors", "params", (_LORA_MODEL,), "LoRAModel.clone", CLONE_PARAMETERS, _HOST),
    Touchpoint("the manager's capacity", "members", (_MODEL_MANAGER,), "LoRAModelManager", ("capacity",), _HOST),
    Touchpoint(
        "LoRARequest's fields",
        "fields",
        ("lora/request.py",),
        "LoRARequest",
        ("lora_name", "lora_int_id", "lora_path", "is_3d_lora_weight"),
        _HOST,
    ),
    Touchpoint(
        "GPUModelRunner.capture_model",
        "params",
        ("v1/worker/gpu_model_runner.py",),
        "GPUModelRunner.capture_model",
        CAPTURE_PARAMETERS,
        _HOST,
    ),
    Touchpoint(
        "GPUModelRunner.profile_cudagraph_memory",
        "params",
        ("v1/worker/gpu_model_runner.py",),
        "GPUModelRunner.profile_cudagraph_memory",
        CAPTURE_PARAMETERS,
        _HOST,
    ),
    Touchpoint(
        "VllmConfig says which model runner runs",
        "members",
        ("config/vllm.py",),
        "VllmConfig",
        ("use_v2_model_runner",),
        _HOST,
    ),
    Touchpoint(
        "the worker's two CUDA-graph capture phases",
        "text",
        ("v1/worker/gpu_worker.py",),
        "the worker's start-up",
        ("self.model_runner.capture_model()", "self.model_runner.profile_cudagraph_memory()"),
        _HOST,
    ),
    Touchpoint(
        "get_adapter_absolute_path", "params", ("lora/utils.py",), "get_adapter_absolute_path", ("lora_path",), _HOST
    ),
    # ---- dummy_loras (CUDA): the warm-up dummy, vLLM's per-phase cache of it, and the end of the start-up ----
    Touchpoint(
        "WorkerLoRAManager.add_dummy_lora",
        "params",
        (_WORKER_MANAGER,),
        "WorkerLoRAManager.add_dummy_lora",
        ADD_DUMMY_LORA_PARAMETERS,
        _DUMMY,
    ),
    Touchpoint(
        "a phase's dummy cache: None inside it, the first dummy made, its clones",
        "text",
        (_WORKER_MANAGER,),
        "WorkerLoRAManager.dummy_lora_cache and add_dummy_lora",
        (
            "self._cached_dummy_lora = None",
            "if isinstance(self._cached_dummy_lora, LoRAModel):",
            "dummy_lora = self._cached_dummy_lora.clone(lora_request.lora_int_id)",
            "if self._cached_dummy_lora is None:",
            "self._cached_dummy_lora = dummy_lora",
        ),
        _DUMMY,
    ),
    Touchpoint(
        "Worker.compile_or_warm_up_model (the start-up's warm-ups and capture)",
        "params",
        ("v1/worker/gpu_worker.py",),
        "Worker.compile_or_warm_up_model",
        WARM_UP_PARAMETERS,
        _DUMMY,
    ),
    # ---- expert_int8 (CUDA, where asked): the MoE LoRA layers' slots, made once and written in place ----
    *(
        Touchpoint(f"{cls}.{fn}", "params", (_FUSED_MOE,), f"{cls}.{fn}", params, _INT8)
        for cls in ("FusedMoEWithLoRA", "FusedMoE3DWithLoRA")
        for fn, params in (
            ("create_lora_weights", MOE_CREATE_PARAMETERS),
            ("set_lora", MOE_SET_LORA_PARAMETERS),
        )
    ),
    Touchpoint(
        "FusedMoEWithLoRA.reset_lora",
        "params",
        (_FUSED_MOE,),
        "FusedMoEWithLoRA.reset_lora",
        MOE_RESET_LORA_PARAMETERS,
        _INT8,
    ),
    Touchpoint(
        "MoE LoRA slots written in place",
        "text",
        (_FUSED_MOE,),
        "set_lora copies into the stacked slots and reset_lora zeroes them, never rebinding them",
        (
            "self.w13_lora_a_stacked[pos][index] = 0",
            "self.w2_lora_b_stacked[0][index] = 0",
            "self.w2_lora_a_stacked[0][",
            "].copy_(sliced_w2_lora_b, non_blocking=True)",
        ),
        _INT8,
    ),
)
