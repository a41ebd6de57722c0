"""Used by the medical recipe only, never by training: duplicate detection, grouped splits, the threshold and bootstrap
statistics, plots and the medical model card."""
