"""Model presets and building, weight initialization, and the FLOP formulas."""
