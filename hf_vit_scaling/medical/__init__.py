"""Only the medical recipe uses these: duplicate detection, grouped splits, the threshold and bootstrap statistics, plots and the medical model card."""
