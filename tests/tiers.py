"""A pytest plugin: the two tiers of the suite. `make test` (the README's test command, within 20 minutes of pytest
on 2 cores) runs every test not marked `extended`; `make test-extended` runs the rest; CI (.ci/run) runs both in one
pytest session (`make test TIER=all`), so the runs both tiers read are made once.

The extended tier holds the launched cells whose code path a core test already runs on a sibling setting:
- the engine variants: ZeRO-0, ZeRO-1 and the two CPU-offload configs wherever they are a cell of an engine matrix
  (ZeRO-2, ZeRO-3 and plain DDP stay core), and FSDP2 with full state dicts where the sharded one is the core cell;
- the conformance matrix's DDP and FSDP2 cells (its core engines are ZeRO-2 and ZeRO-3);
- the further cells of a feature's launched matrix, named below with the core cell that stays and why.
Fixtures that make every cell's run at once (the resume matrix, the conformance resumes, the reload scores) make
only the cells of the tests this session runs (`selected_params`)."""

import pytest

VARIANT_ENGINES = {"zero0", "zero1", "zero2_offload", "zero3_offload"}
# FSDP2 with full state dicts, where FSDP2 sharded is the core cell of the same matrix.
FULL_FSDP2_WHERE_SHARDED_IS_CORE = ("test_fsdp.py::", "test_conformance.py::test_fine_tuning")

# Compile is core on the plain Trainer (test_compile.py: one graph, no break, eager's losses); DDP's compiled wrapper
# and the engines' own compile paths (DeepSpeedEngine.compile, FSDP2's CompileEngine) run in CI's tier.
COMPILE_WHY = "compile is core on the plain Trainer (test_compile.py: one graph, no break, eager's losses)"
# The conformance matrix's core engines are ZeRO-2 and ZeRO-3 (the project's subject); DDP's and FSDP2's cells are
# extended: DDP's resume of every tensor is core in test_resume_exact.py, FSDP2 sharded trains as DDP in test_fsdp.py.
CONFORMANCE_CORE_ELSEWHERE = {"ddp", "fsdp2_sharded"}

# node id substring -> why it is extended (the core cell that covers the same code path).
EXTENDED = {
    "test_slurm.py::test_train_sbatch_interrupted_requeued_and_resumed_exactly[zero2-accelerate-preemption]":
        "the DDP/torchrun requeue (time-limit signal) is the core cell; the engines' own resumes are elsewhere",
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[per_sample-1proc-0workers-mid_epoch]": "augmented resumes are core on the host_crop and device input paths",
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[host_crop-2proc-0workers-mid_epoch]": "host_crop is core on 1 process with workers",
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[shards-1proc-2workers-mid_epoch]": "augmented resumes are core on the host_crop and device input paths",
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[streamed_shards-2proc-2workers-mid_pass]": "streaming is core with Parquet files",
    **{f"test_conformance.py::test_compiled_run_{test}[{engine}]": COMPILE_WHY
       for test in ("trains_the_eager_run_s_losses", "resumes_exactly")
       for engine in ("zero2", "zero3")},  # its DDP and FSDP2 cells: CONFORMANCE_CORE_ELSEWHERE
    "test_gpu_path_flags.py::test_bf16_trains_and_saves_a_model_that_reloads[ddp]": "bf16 is core under ZeRO-3",
    "test_gpu_path_flags.py::test_bf16_trains_and_saves_a_model_that_reloads[zero2]": "bf16 is core under ZeRO-3",
    "test_gpu_path_flags.py::test_bf16_trains_and_saves_a_model_that_reloads[fsdp2]": "bf16 is core under ZeRO-3",
    "test_streaming_launched.py::test_peak_memory_does_not_grow_with_the_data_set":
        "a memory bound over two data-set sizes; streaming's rows per pass are core",
    "test_streaming_launched.py::test_every_row_once_per_pass_across_two_ranks[16]": "the [15] cell is core",
    "test_regularization_launched.py::test_layer_decay_gives_each_parameter_group_its_lr[fsdp2-2-processes]":
        "layer decay is core on the plain Trainer",
    "test_hetero_launched.py::test_uneven_batches_give_the_same_gradient[ddp-own-weights]":
        "uneven batches are core under DDP",
    "test_hetero_launched.py::test_uneven_batches_give_the_same_gradient[fsdp2]": "uneven batches are core under DDP",
    "test_mae_launched.py::test_pretraining_logs_knn_accuracy_and_draws_the_picture[zero2]":
        "MAE pretraining is core under ZeRO-3",
    "test_distillation_launched.py::test_teacher_is_whole_on_every_rank_frozen_and_outside_the_optimizer[zero2_token]":
        "the teacher is core under ZeRO-3",
    "test_interruption_launched.py::test_one_rank_signalled_every_rank_saves_the_step_the_uninterrupted_run_saved"
    "[fsdp2_sharded]": "the agreed stop is core under ZeRO-3 and on one process",
    "test_one_stop_handler_launched.py::test_jit_checkpoint_is_refused_on_every_launch_before_any_step[zero2]":
        "the refusal is core on one process",
    "test_fashion_distil_script.py::test_one_command_trains_the_seed_s_teacher_then_its_student":
        "the distillation recipe is core in test_distillation_launched.py; this runs make fashion-distil's script",
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[streamed_files-1proc-2workers-mid_pass]": "streaming's rows per pass are core; its resumes run in CI's tier",
    "test_slurm.py::test_train_sbatch_interrupted_requeued_and_resumed_exactly[ddp-torchrun-time_limit_signal]":
        "the requeue's resume is the engines' own, core in test_conformance.py; Slurm runs in CI's tier",
    "test_gpu_path_flags.py::test_torch_compile_with_device_inputs_drop_path_and_throughput_hooks":
        "inductor's code generation on the CPU; compile is core with aot_eager (test_compile.py)",
    "test_sequence_parallel_launched.py::test_four_processes_two_data_parallel_groups_of_two":
        "4 processes in 2 groups are core in the draw-and-resume test of the same file",
    "test_sequence_parallel_launched.py::test_recipe_high_resolution_finetune_under_zero3":
        "sequence parallelism through the recipe is core under ZeRO-2",
    "test_distillation_launched.py::test_resume_from_checkpoint_logs_the_uninterrupted_losses":
        "the resume is core under ZeRO-2 (test_reliability.py, after a SIGKILL)",
    "test_regularization_launched.py::test_layer_decay_gives_each_parameter_group_its_lr[zero2-2-processes]":
        "layer decay is core on the plain Trainer",
    "test_hetero_launched.py::test_uneven_batches_give_the_same_gradient[zero2]": "uneven batches are core under DDP",
    "test_one_stop_handler_launched.py::test_jit_checkpoint_is_refused_on_every_launch_before_any_step[ddp]":
        "the refusal is core on one process",
    "test_gpu_check.py::test_dry_run_": "the GPU check's CPU dry run runs benchmarks/gpu_check.py's every item (the "
        "recipe's engines are core in their own tests); its order, budget and wheel install stay core in this file",
    # Second launched paths to a behaviour a core test holds (make test's 20 minutes: benchmarks/README.md).
    "test_resume_augmented.py::test_resume_with_every_augmentation_is_exact_and_runs_only_the_remaining_steps"
    "[per_sample-2proc-2workers-epoch_end]": "augmented resumes are core on 1 process (host_crop, device input "
        "paths); ranks' distinct draws are core in test_sequence_parallel_launched.py (4 processes)",
    "test_reliability.py::test_zero2_resume_one_process_on_two":
        "ZeRO-2 resumed on another world size is core in test_conformance.py (2 processes -> 1)",
    "test_reliability.py::test_zero3_torchrun_restarts_killed_job_from_latest_checkpoint":
        "a killed rank and the resume from the latest checkpoint are core under ZeRO-2 (SIGKILL, this file)",
    "test_reliability.py::test_nan_loss_skip_leaves_the_step_out_on_every_rank":
        "the non-finite check on every rank is core with the stop policy (this file)",
    "test_regularization_launched.py::test_zero2_ema_resumes_exactly":
        "the SIGKILL resume is core in test_reliability.py; the EMA's saved state in the best-model test here",
    "test_streaming_launched.py::test_resume_trains_on_the_same_rows":
        "streaming's rows per pass are core; its resume runs in CI with the streamed resume_augmented cells",
    "test_mae_launched.py::test_resume_logs_the_uninterrupted_losses":
        "the SIGKILL resume is core under ZeRO-2 (test_reliability.py); MAE pretraining is core under ZeRO-3",
    "test_mae_script.py::test_one_command_pretrains_fine_tunes_and_writes_its_results":
        "MAE pretraining and its fine-tuning are core in test_mae_launched.py; this runs recipes/mae/run.sh",
    "test_resume_exact.py::test_a_zero2_checkpoint_resumed_without_its_engine_stops_with_one_error_line":
        "a refused resume's one error line is core (a checkpoint missing a tensor, this file)",
    "test_gpu_path_flags.py::test_bf16_with_sequence_parallelism":
        "bf16 is core under ZeRO-3, sequence parallelism under ZeRO-2 (test_sequence_parallel_launched.py)",
    "test_recipe_distributed.py::test_zero0_one_process_matches_plain_trainer": "ZeRO-0 is an engine variant",
    "test_flag_walks.py::test_walks_in_layout_md_are_the_traced_ones":
        "one traced recipe run; `python tools/trace_flags.py` rewrites the walks, the stale-walk message is core",
    "test_interruption_launched.py::test_torchrun_forwards_sigterm_and_every_rank_stops_at_the_same_step":
        "the agreed stop is core with one rank signalled under ZeRO-3 and on one process (this file)",
    "test_distillation_launched.py::test_teacher_is_whole_on_every_rank_frozen_and_outside_the_optimizer"
    "[zero3_plain]": "distillation through the recipe is core (the saved students' reload and accuracy)",
    "test_slurm.py::test_scaling_study_sbatch_runs_on_local_slurm": "the scaling study end to end and resumed is "
        "core in test_studies_launched.py; Slurm's sbatch runs in CI's extended tier (.ci/run installs Slurm)",
    "test_recipe_distributed.py::test_every_ds_config_trains_saves_and_reloads[zero2]":
        "ZeRO-2's saved model reloads in test_conformance.py's fine-tuning cell (core)",
}  # fmt: skip


def is_extended(nodeid: str, params: list[str]) -> bool:
    if any(key in nodeid for key in EXTENDED):
        return True
    if "tests/launched/" in nodeid and "test_launchers_two_processes" not in nodeid and VARIANT_ENGINES & set(params):
        return True  # (the deepspeed launcher's one cell runs ZeRO-1: it is that launcher's test, so core)
    if "test_conformance.py::" in nodeid and CONFORMANCE_CORE_ELSEWHERE & set(params):
        return True
    return "fsdp2" in params and any(where in nodeid for where in FULL_FSDP2_WHERE_SHARDED_IS_CORE)


def item_params(item) -> list[str]:
    callspec = getattr(item, "callspec", None)
    return callspec.id.split("-") if callspec is not None else []


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_extended(item.nodeid, item_params(item)):
            item.add_marker(pytest.mark.extended)


def selected_params(request, argname: str) -> list:
    """The values of `argname` in the tests of the requesting module that this session runs (after -m/-k), in
    collection order: what a fixture that makes every cell at once should make."""
    module = request.node.module if hasattr(request.node, "module") else None
    values = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is module and callspec is not None and argname in callspec.params:
            value = callspec.params[argname]
            if value not in values:
                values.append(value)
    return values
