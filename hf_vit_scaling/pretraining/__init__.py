"""Masked-autoencoder (MAE) pretraining, recipes/pretrain_mae.py only: the trainer's evaluation (`trainer`), the
k-NN progress metric (`knn`), the reconstruction picture (`reconstruction`) and the recipe's building blocks
(`run`). The model and its fine-tuning load are in `models/mae.py`, the FLOPs in `models/flops.py`."""
