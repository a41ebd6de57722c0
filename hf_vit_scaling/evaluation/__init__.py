"""Metrics for the Trainer (shipped `evaluate` modules loaded by path, no Hub), classification statistics, and the model card."""
