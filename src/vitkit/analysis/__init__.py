"""Looking inside a ViT as the paper does (section 4.5, Figures 6 and 7): attention rollout, mean
attention distance, position-embedding similarity, principal components of the patch filters,
and pictures of each (``vitkit.analysis.figures``, needs matplotlib)."""

from .attention import (
    attention_rollout,
    cls_rollout_map,
    collect_attention,
    grid_of,
    mean_attention_distance,
    patch_distances,
    rollout_map,
    token_attention_maps,
)
from .embeddings import FilterPCA, embedding_filter_components, pos_embed_similarity, pos_embed_similarity_summary
from .figures import (
    plot_attention_maps,
    plot_filter_components,
    plot_mean_attention_distance,
    plot_pos_embed_similarity,
    plot_rollout_overlay,
)
from .report import Report, analyze, model_name, sample_images

__all__ = [
    "FilterPCA",
    "Report",
    "analyze",
    "attention_rollout",
    "cls_rollout_map",
    "collect_attention",
    "embedding_filter_components",
    "grid_of",
    "mean_attention_distance",
    "model_name",
    "patch_distances",
    "plot_attention_maps",
    "plot_filter_components",
    "plot_mean_attention_distance",
    "plot_pos_embed_similarity",
    "plot_rollout_overlay",
    "pos_embed_similarity",
    "pos_embed_similarity_summary",
    "rollout_map",
    "sample_images",
    "token_attention_maps",
]
