"""The classification head every vitkit model shares: replaceable, zero-initialised (section 3.2)."""

from __future__ import annotations

from torch import nn


class ReplaceableHead:
    """Mixin for models with ``cfg``, ``num_features`` and an optional linear ``head``."""

    def reset_classifier(self, num_classes: int, bias_init: float = 0.0) -> None:
        """Replace the head by a zero-initialised one (the paper's fine-tuning); 0 removes it.
        A DeiT distillation head (``head_dist``) is replaced (or removed) with it."""
        p = next(self.parameters())
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        self.head = self._new_head(self.num_features, num_classes, bias_init, p)
        if getattr(self.cfg, "distill_token", False):
            self.head_dist = self._new_head(self.cfg.width, num_classes, bias_init, p)

    @staticmethod
    def _new_head(features: int, num_classes: int, bias_init: float, like: nn.Parameter) -> nn.Linear | None:
        if not num_classes:
            return None
        head = nn.Linear(features, num_classes, device=like.device, dtype=like.dtype)
        nn.init.zeros_(head.weight)
        nn.init.constant_(head.bias, bias_init)
        return head
