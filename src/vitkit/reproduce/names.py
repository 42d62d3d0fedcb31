"""The experiments and budgets by name (no imports: the command line lists them without torch)."""

EXPERIMENTS = ("data-scaling", "compute", "pos-embed", "pooling", "attention", "resolution")
"""The experiments ``vitkit reproduce`` runs, by name, in the order it runs them."""
BUDGETS = ("smoke", "desktop", "full")
"""The budgets: "smoke" (the pipeline in minutes), "desktop" (a few hours on a CPU) and "full"
(GPUs and ImageNet-scale data)."""
