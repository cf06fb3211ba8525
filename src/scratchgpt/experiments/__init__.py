"""Small self-contained experiments, each a task for the training core plus its report."""
