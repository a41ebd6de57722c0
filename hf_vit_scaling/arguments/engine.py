"""How the run scales out: engine extras (sequence parallelism), learning-rate scaling with the global batch, and
the cluster (slow ranks, uneven batch shares)."""

from dataclasses import dataclass, field

from hf_vit_scaling.arguments.field_checks import require_at_least
from hf_vit_scaling.optim.lr_scaling import LR_SCALING_RULES
from hf_vit_scaling.parallel.hetero import parse_balance_spec, parse_slow_ranks


@dataclass
class EngineArguments:
    """Which engine trains: DeepSpeed (a ds_config), FSDP2 (the Trainer's --fsdp --fsdp_config
    fsdp_configs/fsdp2.json) or the plain Trainer; and sequence parallelism on DeepSpeed."""

    ds_config: str | None = field(
        default=None,
        metadata={
            "help": "DeepSpeed JSON config (see ds_configs/). Feeds TrainingArguments.deepspeed; without "
            "it (and without --deepspeed or --fsdp) the plain Trainer runs (DDP when several processes are "
            "launched). FSDP2 instead: --fsdp --fsdp_config fsdp_configs/fsdp2.json (see fsdp_configs/README.md)."
        },
    )
    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Split each training image's patch sequence over N ranks (DeepSpeed Ulysses attention); world "
            "size = data-parallel replicas x N, and the N ranks of a group share their images. Needs --ds_config "
            "(ZeRO 0-3) and a head count divisible by N. For high resolutions, e.g. ViT-B/16 at 1024 px = "
            "4,097 tokens."
        },
    )


@dataclass
class LearningRateArguments:
    """Scaling the learning rate with the global batch."""

    lr_scaling: str = field(
        default="none",
        metadata={
            "help": "Scale --learning_rate with the global batch: linear (lr x B/B_ref) or sqrt (lr x sqrt(B/B_ref)), "
            "relative to --reference_batch_size; adds a 5%% warmup when none is set. none: use it as given.",
            "choices": list(LR_SCALING_RULES),
        },
    )
    reference_batch_size: int = field(
        default=256, metadata={"help": "Global batch at which --learning_rate was tuned (for --lr_scaling)."}
    )

    def __post_init__(self):
        require_at_least(self, 1, "reference_batch_size")


@dataclass
class ClusterArguments:
    """Heterogeneous clusters: balancing per-rank batches, and simulating slow ranks for studies."""

    balance_batches: str = field(
        default="off",
        metadata={
            "help": "Heterogeneous GPUs: 'calibrate' times each rank at start and gives it a micro-batch proportional "
            "to its speed (same global batch, same gradient: losses are weighted); or explicit shares per rank, "
            "e.g. '1,2'; 'off' (default): equal micro-batches. Plain DDP and ZeRO 0-2."
        },
    )
    simulate_slow_ranks: str | None = field(
        default=None,
        metadata={
            "help": "SIMULATION for straggler studies: slow chosen ranks by a factor, e.g. '1:2.0' or '1:2.0,3:1.5'. "
            "Each step's compute on that rank is stretched by sleeping. Labelled in every report."
        },
    )

    def __post_init__(self):
        parse_balance_spec(self.balance_batches)  # the grammar now; the share count once the world size is known
        self.slow_ranks = parse_slow_ranks(self.simulate_slow_ranks)
