"""Metrics for the Trainer (`metrics`), shipped `evaluate` modules loaded by path with no Hub (`metric_loading`,
`metric_modules/`), classification statistics and the model card."""
