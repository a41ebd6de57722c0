"""End a run's persistent DataLoader workers before the interpreter exits.

With `--dataloader_persistent_workers`, the train and eval loaders keep their worker processes (and, on a GPU, a
pin-memory thread) until interpreter exit. Left to it, torch waits 5 s per worker and loader when pin memory is on
(pytorch/pytorch#81794): with 8 workers, 8 x 5 s x 2 loaders, which kept every recipe process of the GPU check alive
long after its done line (the versions and that run: benchmarks/README.md, "GPU check"). `finish_run` calls this
while the interpreter can still join them.
"""


def release_loader_workers(trainer) -> None:
    """End the workers of the train loaders the training loop was given (`VitTrainer._loaders_made`) and of the eval
    loaders the Trainer keeps for persistent workers (`Trainer._eval_dataloaders`)."""
    loaders = [*getattr(trainer, "_loaders_made", []), *getattr(trainer, "_eval_dataloaders", {}).values()]
    for loader in loaders:
        base = getattr(loader, "base_dataloader", loader)  # accelerate's DataLoaderShard wraps the torch one
        iterator = getattr(base, "_iterator", None)  # where a persistent-worker DataLoader keeps its iterator
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            base._iterator = None
            iterator._shutdown_workers()
    if hasattr(trainer, "_loaders_made"):
        trainer._loaders_made.clear()
    trainer._eval_dataloaders = {}
