"""vitkit models: ViT, R+ViT hybrids and BiT ResNets; LoRA/DoRA adapters on a ViT."""

from .adapters import (
    AdapterSpec,
    adapter_parameters,
    adapter_spec_from_dict,
    adapter_state_dict,
    apply_adapters,
    merge_adapters,
)
from .config import ResNetConfig, ViTConfig
from .features import FeatureInfo, ResNetFeatures, ViTFeatures, features_model
from .flops import count_params, model_flops
from .posembed import (
    learned_2d_pos_table,
    relative_offset_index,
    resample_1d,
    resample_pos_embed,
    resample_relative_embed,
    sincos_2d_pos_embed,
)
from .registry import build_model, canonical_name, create_model, list_models, model_config
from .resnet import ResNetV2
from .vit import VisionTransformer

__all__ = [
    "AdapterSpec",
    "FeatureInfo",
    "ResNetConfig",
    "ResNetFeatures",
    "ResNetV2",
    "ViTConfig",
    "ViTFeatures",
    "VisionTransformer",
    "adapter_parameters",
    "adapter_spec_from_dict",
    "adapter_state_dict",
    "apply_adapters",
    "build_model",
    "canonical_name",
    "count_params",
    "create_model",
    "features_model",
    "learned_2d_pos_table",
    "list_models",
    "merge_adapters",
    "model_config",
    "model_flops",
    "relative_offset_index",
    "resample_1d",
    "resample_pos_embed",
    "resample_relative_embed",
    "sincos_2d_pos_embed",
]
