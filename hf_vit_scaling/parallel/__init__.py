"""How work is spread over processes: rank and world helpers (`distributed`), the engine (DeepSpeed ZeRO-n, FSDP2 or
DDP: `engine`), DeepSpeed configs (`deepspeed_config`), sequence parallelism and heterogeneous clusters (`hetero`)."""
