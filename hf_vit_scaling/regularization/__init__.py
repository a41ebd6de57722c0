"""Device-side augmentation (RandAugment, Mixup/CutMix, erasing) and model regularization (drop path, EMA, layer decay)."""
