"""How work is spread over processes: rank/world helpers, the engine choice (DeepSpeed ZeRO-n, FSDP2, DDP), DeepSpeed config checks, sequence parallelism, heterogeneous clusters."""
