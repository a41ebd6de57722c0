"""Per-rank timing figures and a run setup, as `ThroughputCallback` hands them to `summarize`, shared by the
summary and schema tests."""

NOT_COMPILED = dict(graphs=0, graphs_after_warmup=0, last_compile_step=None, compile_time_s=0.0, warmup_time_s=1.2)


def rank_figures(images, measured_time, own_work, node="host#0", compile_figures=NOT_COMPILED):
    return {
        "steps": len(own_work), "images": images, "measured_time": measured_time, "compute_mean": 0.5,
        "data_wait_mean": 0.1, "forward_mean": 0.1, "input_mean": 0.0, "step_time_mean": 0.6, "step_time_median": 0.6,
        "step_time_p90": 0.7, "own_work": own_work, "device": "cpu", "hostname": node.split("#")[0], "node": node,
        "memory": {"allocated_peak_bytes": None, "reserved_peak_bytes": None, "rss_peak_bytes": 100 * 2**20},
        "compile": dict(compile_figures),
    }  # fmt: skip


SETUP = {
    "engine": "deepspeed", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "zero_stage": 2,
    "offload": {}, "precision": "fp32", "image_size": 32, "patch_size": 4, "tokens_per_image": 65,
    "num_parameters": 1000, "forward_macs_per_image": 10**9, "train_flops_per_image": 6 * 10**9,
    "teacher_forward_flops_per_image": None, "versions": {}, "simulated_slow_ranks": {},
    "rank_batches": None, "sequence_parallel_size": 1, "warmup_steps": 2, "peak_tflops": 1.0,
    "peak_source": "user", "memory_kind": "rss_peak_bytes", "torch_compile": False, "compile_backend": None,
}  # fmt: skip
