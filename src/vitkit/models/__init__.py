"""vitkit models: ViT, R+ViT hybrids and BiT ResNets."""

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
    "FeatureInfo",
    "ResNetConfig",
    "ResNetFeatures",
    "ResNetV2",
    "ViTConfig",
    "ViTFeatures",
    "VisionTransformer",
    "build_model",
    "canonical_name",
    "count_params",
    "create_model",
    "features_model",
    "learned_2d_pos_table",
    "list_models",
    "model_config",
    "model_flops",
    "relative_offset_index",
    "resample_1d",
    "resample_pos_embed",
    "resample_relative_embed",
    "sincos_2d_pos_embed",
]
