"""Every training loss the recipes compute themselves, one module per kind, all reduced the one way the Trainer's loss
scaling expects (`reduction.reduce_per_image_loss`): class weighting (`class_weighting`). Mixup/CutMix's soft-target
loss (`regularization/mixing.py`) and DeiT's distillation loss (`training/distillation.py`) build on the same
reduction; a new loss goes here (docs/layout.md)."""
