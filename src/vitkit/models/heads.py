"""The classification head every vitkit model shares: replaceable, zero-initialised (section 3.2)."""

from __future__ import annotations

from torch import nn


class ReplaceableHead:
    """Mixin for models with ``cfg``, ``num_features`` and an optional linear ``head``."""

    def reset_classifier(self, num_classes: int, bias_init: float = 0.0) -> None:
        """Replace the head by a zero-initialised one (the paper's fine-tuning); 0 removes it."""
        p = next(self.parameters())
        self.num_classes = num_classes
        self.cfg = self.cfg.replace(num_classes=num_classes)
        if num_classes:
            self.head = nn.Linear(self.num_features, num_classes, device=p.device, dtype=p.dtype)
            nn.init.zeros_(self.head.weight)
            nn.init.constant_(self.head.bias, bias_init)
        else:
            self.head = None
