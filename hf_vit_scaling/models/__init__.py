"""Model presets and building (`presets`), weight initialization (`weight_init`) and the FLOP formulas (`flops`)."""
