"""`VitTrainer`: the Trainer plus what the recipes need, every feature given to the constructor (the one place
features attach: each is a callback, a small module, or an argument of the Trainer itself). What depends on the
Trainer's internals (checkpoint saves and loads, the restores a resume leaves out, the push) is in `upstream.py`,
pinned by tests/unit/training/test_upstream.py.

- `model_card`: the facts of the run; `write_model_card()` (and `push_to_hub`) writes our card with the latest
  evaluation metrics instead of the generic one;
- `sequence_parallel`: training batches sharded by data-parallel rank (`hf_vit_scaling.parallel.sequence_parallel`);
- `rank_batches`: per-rank micro-batch sizes (heterogeneous clusters): each rank reads its own slice of every global
  batch and weights its loss by b_r x W / B (see `hf_vit_scaling.parallel.hetero`);
- `nonfinite_policy`: a NaN/inf training loss on any rank stops training ("stop") or skips that optimizer step on
  every rank ("skip"), see `nonfinite.NonFiniteLossPolicy`;
- checkpoints and loads (`upstream.UpstreamOverrides`): each save marked complete before old ones are rotated away,
  strict loads of every tensor on resume and for the best model, the restores a resume leaves out;
- `bad_samples`: images that could not be decoded and were left out of their batch (see `data.decoding`);
- `trace_samples`: each training micro-batch's indices and pixel fingerprint (`sample_trace.SampleTrace`);
- every rank's random draws differ from the others' (`seeding.PerRankRandomness`), reproducibly from `--seed`.
- a streamed training split (`data.streaming`): its own loader, and each checkpoint holds the data position of
  every rank (`data_position/rank{R}.json`) before it is marked complete;
- `optimization`: the optimizer and its schedule, built by `optim.build.Optimization` (`create_optimizer`,
  `create_scheduler`); with --layer_decay, BEiT's per-layer learning rates as the optimizer's parameter groups
  (every ZeRO stage), written to output_dir/layer_decay_groups.json as the optimizer holds them when training starts;
- `ema`: an `EMACallback`; evaluation adds `eval_ema_*`, each checkpoint holds `ema.safetensors` before it is marked.
- `throughput`: the `ThroughputCallback`'s settings (`throughput.timing`): throughput.json and the printed table;
- `class_reports`: the latest confusion matrix and per-class accuracy of each evaluation (`eval`, `eval_ema`), when
  `compute_metrics` keeps them (`evaluation.ModuleComputeMetrics`); `run.finish_run` writes them.
- `stop_signals`: the signals `--stop_signals` names, parsed (`interruption.parse_stop_signals`), e.g. (SIGTERM,
  SIGUSR1): on one of them every rank stops at the next optimizer step with a checkpoint,
  and `train` raises `TrainingInterrupted` (`interruption.StopOnSignal`; output_dir/interrupted.json says which).
- ZeRO-1/2's weight gather left in flight while the next batch loads (`FinishesWeightGathers` and
  `attach_weight_gather_waits`, `parallel/fast_paths/weight_gathers.py`);
- `--torch_compile`: the model the loop trains is compiled under every engine, before the first step
  (`compile.CompileEngine`); the throughput report says from dynamo's counters whether it was.
Injected faults (`faults.FaultInjector`) do nothing unless the environment asks for them.
"""

from hf_vit_scaling.data.sample_randomness import EpochOfDraws
from hf_vit_scaling.data.streaming.loader import StreamingTrainData
from hf_vit_scaling.evaluation.model_card import write_model_card
from hf_vit_scaling.optim.build import Optimization
from hf_vit_scaling.parallel.distributed import gather_object
from hf_vit_scaling.parallel.fast_paths.weight_gathers import FinishesWeightGathers, attach_weight_gather_waits
from hf_vit_scaling.parallel.hetero import loss_weight, uneven_batch_loader
from hf_vit_scaling.parallel.sequence_parallel import shard_dataloader_by_data_parallel_rank
from hf_vit_scaling.throughput.timing import add_throughput_callback
from hf_vit_scaling.training.compile import CompileEngine
from hf_vit_scaling.training.faults import FaultInjector
from hf_vit_scaling.training.interruption import StopOnSignal
from hf_vit_scaling.training.nonfinite import NonFiniteLossPolicy
from hf_vit_scaling.training.sample_trace import SampleTrace
from hf_vit_scaling.training.seeding import PerRankRandomness, pin_data_order_seed
from hf_vit_scaling.training.upstream import UpstreamOverrides


class VitTrainer(FinishesWeightGathers, UpstreamOverrides):
    """The Trainer plus the features in the module docstring; each is off unless its argument is given."""

    def __init__(
        self,
        *args,
        model_card: dict | None = None,
        rank_batches: list[int] | None = None,
        sequence_parallel=None,
        nonfinite_policy: str = "stop",
        trace_samples: bool = False,
        optimization: Optimization | None = None,
        ema=None,
        throughput: dict | None = None,
        stop_signals: tuple = (),
        **kwargs,
    ):
        if kwargs.get("args") is not None:
            pin_data_order_seed(kwargs["args"])  # before the Trainer reads it into its data loader configuration
        super().__init__(*args, **kwargs)
        attach_weight_gather_waits(self)  # at the front of the callbacks: ZeRO-1/2's gathers finished at every event
        sp_size = sequence_parallel.sp_size if sequence_parallel is not None else 1
        self.add_callback(PerRankRandomness(sp_size))  # augmentation and drop path differ across data-parallel ranks
        host_draws = getattr(self.train_dataset, "randomness", None)
        if host_draws is not None:  # host transforms seeded per (seed, epoch, row): tell them the epoch
            self.add_callback(EpochOfDraws(host_draws))
        self.ema = self._attach(ema)
        self.optimization = optimization or Optimization()  # the optimizer and its schedule (optim/build.py)
        self.layer_decay_report = self._attach(self.optimization.report)
        self.model_card_facts = model_card
        self.rank_batches = rank_batches
        self._loaders_made = []  # train loaders handed to the training loop (training/loader_workers.py)
        self.sequence_parallel = sequence_parallel
        self.nonfinite = self._attach(NonFiniteLossPolicy(self, nonfinite_policy))  # reads its flag at log/save
        if ema is not None:
            ema.skipped_steps = self.nonfinite.skipped_steps  # one list: a skipped step is left out of the EMA too
        self.trace = SampleTrace(self.args.output_dir, self.args.process_index) if trace_samples else None
        self.bad_samples: list[dict] = []  # {"split", "sample", "reason"} seen by this rank
        self.class_reports: dict[str, dict] = {}  # metric prefix -> the latest evaluation's per-class results
        self.stream_position = None  # --streaming: the data position after the last batch trained
        self.faults = FaultInjector(self.args.process_index)
        if self.faults:
            self.add_callback(self.faults)
        self.stop_on_signal = StopOnSignal(stop_signals) if stop_signals else None  # parsed at parse time
        if self.stop_on_signal is not None:
            self.add_callback(self.stop_on_signal)
        self.compile_engine = self._attach(CompileEngine(self))
        if throughput is not None:  # first in the callback list: its figures reach the reporting integrations
            add_throughput_callback(self, **throughput)

    def _attach(self, callback):
        """Add `callback` to the Trainer's unless it is None (its feature is off); return it."""
        if callback is not None:
            self.add_callback(callback)
        return callback

    def train(self, *args, **kwargs):
        """`Trainer.train`; stopped by one of `stop_signals`: `TrainingInterrupted` on every rank after the save."""
        result = super().train(*args, **kwargs)
        if self.stop_on_signal is not None:
            self.stop_on_signal.raise_if_stopped(self.args.output_dir, self.is_world_process_zero())
        return result

    @property
    def skipped_steps(self) -> list[int]:
        return self.nonfinite.skipped_steps

    # ------------------------------------------------------------------ model card

    def write_model_card(self, metrics: dict | None = None) -> None:
        """Write README.md (main process): the run's facts plus `metrics` (default: the latest evaluation's), without
        runtimes and rates. The metrics given once are kept for the card `push_to_hub` writes."""
        if metrics is not None:
            self._card_metrics = metrics
        if self.model_card_facts is None or not self.is_world_process_zero():
            return
        if metrics is None:
            metrics = getattr(self, "_card_metrics", None) or next(
                (entry for entry in reversed(self.state.log_history) if "eval_loss" in entry), {}
            )
        shown = {
            k: v for k, v in metrics.items() if k.startswith("eval_") and "runtime" not in k and "per_second" not in k
        }
        write_model_card(self.args.output_dir, {**self.model_card_facts, "metrics": shown})

    def create_model_card(self, *args, **kwargs):
        if self.model_card_facts is None:
            return super().create_model_card(*args, **kwargs)
        self.write_model_card()

    # ------------------------------------------------------------------ batches per rank

    def get_train_dataloader(self):
        loader = self._train_dataloader_for_this_run()
        self._loaders_made.append(loader)  # training/loader_workers.py ends its persistent workers
        return loader

    def _train_dataloader_for_this_run(self):
        if isinstance(self.train_dataset, StreamingTrainData):  # batches made in the stream, one rank's shards
            return self.train_dataset.loader(
                self.args.dataloader_pin_memory,
                self.args.dataloader_prefetch_factor,
                self.args.dataloader_multiprocessing_context,
            )
        if self.sequence_parallel is not None:
            sp = self.sequence_parallel
            return shard_dataloader_by_data_parallel_rank(super().get_train_dataloader(), sp.dp_size, sp.dp_rank)
        if not self.rank_batches:
            return super().get_train_dataloader()
        return uneven_batch_loader(
            self.train_dataset,
            self.rank_batches,
            self.data_collator,
            self.args.process_index,
            self.args.data_seed or self.args.seed,
            self.args.dataloader_drop_last,
            self.args.dataloader_num_workers,
            self.args.dataloader_pin_memory,
        )

    def _loss_normalised_by_global_count(self, num_items_in_batch) -> bool:
        """transformers 5 already sums each rank's loss and divides by the item count of the whole global batch
        (gathered over ranks) and multiplies by the world size, when the model takes loss kwargs (ViT does) and
        `average_tokens_across_devices` is on (the default): that is exactly w_r x mean_r, so nothing to add."""
        return (
            num_items_in_batch is not None
            and bool(self.model_accepts_loss_kwargs)
            and bool(self.args.average_tokens_across_devices)
        )

    # ------------------------------------------------------------------ batches: bookkeeping fields, trace

    def _pop_bookkeeping(self, inputs: dict, training: bool) -> None:
        """Remove the fields the collator adds for us (the model must not see them) and record them."""
        indices = inputs.pop("sample_index", None)
        bad = inputs.pop("bad_samples", None) or []
        position = inputs.pop("stream_position", None)
        split = "train" if training else "eval"
        self.bad_samples.extend({"split": split, **b} for b in bad)
        if training and position is not None:
            self.stream_position = position
        if training and self.trace is not None and indices is not None:
            self.trace.expect(self.model, indices, {"pass": position["pass"]} if position is not None else {})

    # ------------------------------------------------------------------ training step and loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.finish_resume()
        self.faults.before_training_step(model, self.state.global_step + 1)
        loss = super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)
        self.nonfinite.after_training_step(model)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._pop_bookkeeping(inputs, model.training)
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        if self.trace is not None:
            self.trace.write(self.state.global_step + 1)  # after the forward: its input hooks have made the pixels
        loss = result[0] if return_outputs else result
        if model.training:
            self.nonfinite.check(loss)
        if not self.rank_batches or not model.training or self._loss_normalised_by_global_count(num_items_in_batch):
            return result
        weight = loss_weight(self.rank_batches, self.args.process_index)
        if return_outputs:
            return result[0] * weight, result[1]
        return result * weight

    def create_optimizer(self, model=None):
        if self.optimizer is None:  # `optim.build.Optimization`: None leaves the Trainer's own optimizer
            built = self.optimization.optimizer_cls_and_kwargs(self, self.model if model is None else model)
            if built is not None:
                self.optimizer_cls_and_kwargs = built
        return super().create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:  # `optim.build.Optimization`: None leaves the Trainer's --lr_scheduler_type
            opt, n, args = self.optimizer if optimizer is None else optimizer, num_training_steps, self.args
            self.lr_scheduler = self.optimization.scheduler(opt, n, args.get_warmup_steps(n), args.lr_scheduler_kwargs)
        return super().create_scheduler(num_training_steps, optimizer)

    def evaluate(self, *args, metric_key_prefix: str = "eval", **kwargs):
        metrics = super().evaluate(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        self._file_class_report(metric_key_prefix)
        if self.ema is not None and self.ema.shadow is not None and metric_key_prefix == "eval":
            with self.ema.applied(self.model):
                metrics.update(super().evaluate(*args, metric_key_prefix="eval_ema", **kwargs))
            self._file_class_report("eval_ema")
        return metrics

    def _file_class_report(self, prefix: str) -> None:
        """Take the per-class results `compute_metrics` kept from the evaluation that just ran (taken, so a later
        evaluation that computes no metrics cannot file them again under its own prefix)."""
        report = getattr(self.compute_metrics, "latest", None)
        if report is not None:
            self.compute_metrics.latest = None
            self.class_reports[prefix] = report

    # ------------------------------------------------------------ checkpoints: our files in each (upstream.py saves)

    def saving(self, step: int):
        return self.faults.during_save(step)

    def save_checkpoint_extras(self, folder: str) -> None:
        if self.ema is not None and self.args.should_save:
            self.ema.save_state(folder)  # before the checkpoint is marked complete, so the marker lists it
        if isinstance(self.train_dataset, StreamingTrainData):  # every rank, before the marker (as above)
            self.train_dataset.save_position(folder, self.stream_position)

    # ------------------------------------------------------------------ end of training

    def gather_bad_samples(self) -> list[dict]:
        """Every rank's skipped images (a collective: call on all ranks)."""
        return [b for part in gather_object(self.bad_samples) for b in part]

    def close_trace(self) -> None:
        if self.trace is not None:
            self.trace.close()
