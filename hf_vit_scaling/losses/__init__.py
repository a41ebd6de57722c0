"""Every training loss the recipes compute themselves, one module per kind, all reduced the one way the Trainer's loss
scaling expects (`reduction.reduce_per_image_loss`): soft targets and their cross-entropy (label smoothing, Mixup/
CutMix: `soft_target`), class weighting (`class_weighting`), DeiT distillation (`distillation`). A new loss goes
here (docs/layout.md)."""
