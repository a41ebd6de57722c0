"""Device-side augmentation (`rand_augment`, `mixing`, erasing in `batch_augmenter`) and model regularization
(`drop_path`, `ema`); layer-wise lr decay is the optimizer's (`optim/layer_decay.py`)."""
