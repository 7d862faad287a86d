"""The MoE shape of a ModelServer's model: what `kernels.configs: auto` matches the bundled kernel configs against.

The shape is spec.kernels.shape when given, else the entry for spec.model.name (matched case-insensitively) in
KNOWN_SHAPES, the models moelora knows the config.json values of. Neither is a SpecProblem: the operator never
guesses a shape from a name it does not know.
"""

from __future__ import annotations

from moelora.api import ModelServerSpec, MoeShape
from moelora.operator.errors import SpecProblem

_GPT_OSS_20B = MoeShape(hidden_size=2880, moe_intermediate_size=2880, num_experts=32)
_QWEN3_30B_A3B = MoeShape(hidden_size=2048, moe_intermediate_size=768, num_experts=128)

# Model id -> shape, from each model's config.json (hidden_size, moe_intermediate_size or GPT-OSS'
# intermediate_size, num_experts or GPT-OSS' num_local_experts). Fine-tunes share their base's shape.
KNOWN_SHAPES: dict[str, MoeShape] = {
    "openai/gpt-oss-20b": _GPT_OSS_20B,
    "Qwen/Qwen3-30B-A3B": _QWEN3_30B_A3B,
    "Qwen/Qwen3-30B-A3B-Base": _QWEN3_30B_A3B,
    "Qwen/Qwen3-30B-A3B-Instruct-2507": _QWEN3_30B_A3B,
    "Qwen/Qwen3-30B-A3B-Thinking-2507": _QWEN3_30B_A3B,
}
_BY_LOWER_ID = {model_id.lower(): shape for model_id, shape in KNOWN_SHAPES.items()}


def key(shape: MoeShape) -> tuple[int, int, int]:
    return shape.hidden_size, shape.moe_intermediate_size, shape.num_experts


def describe(shape: MoeShape) -> str:
    """The shape in the CRD's own field names, so a message can be copied into spec.kernels.shape."""
    return (
        f"hiddenSize={shape.hidden_size} moeIntermediateSize={shape.moe_intermediate_size} "
        f"numExperts={shape.num_experts}"
    )


def known_shape(model_name: str) -> MoeShape | None:
    return _BY_LOWER_ID.get(model_name.lower())


def model_shape(spec: ModelServerSpec) -> MoeShape:
    """spec.kernels.shape, else the known shape of spec.model.name; raises SpecProblem(ModelShapeUnknown)."""
    if spec.kernels.shape is not None:
        return spec.kernels.shape
    shape = known_shape(spec.model.name)
    if shape is None:
        raise SpecProblem(
            "ModelShapeUnknown",
            f"kernels.configs is auto, but moelora does not know the MoE shape of "
            f"{spec.model.name!r}; set kernels.shape from the model's config.json (hiddenSize, "
            "moeIntermediateSize, numExperts), or use kernels.configs=configMap or none",
        )
    return shape
