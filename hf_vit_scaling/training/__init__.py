"""The training loop around the Trainer: `VitTrainer` (`trainer`), the recipe's building blocks (`run`), checkpoints
and resume, fault injection, learning-rate scaling, forward hooks, losses and class imbalance."""
