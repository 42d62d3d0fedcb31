"""The experiments and budgets by name (no imports: the command line lists them without torch)."""

EXPERIMENTS = ("data-scaling", "compute", "pos-embed", "pooling", "attention", "resolution")
BUDGETS = ("smoke", "desktop", "full")
