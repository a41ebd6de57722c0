"""Scaling analysis: speedup and efficiency from study rows, report tables, and plots.

Definitions (T = epoch time, N = number of processes in the world, T1 = the 1-process run of the same study):
- speedup S_N = T1 / T_N;
- strong scaling (fixed global batch and data): efficiency = T1 / (N x T_N) = S_N / N, ideal 1;
- weak scaling (fixed per-device batch, data grows with N): efficiency = T1 / T_N, ideal 1.
When a study has no 1-process run (e.g. 4 nodes x 1..8 GPUs), its smallest world B is the baseline:
speedup T_B / T_N, strong efficiency (B x T_B) / (N x T_N).
Study check (arXiv 2602.21081, CIFAR-100 on T4s): T1 = 1817.65 s, T32 = 61.32 s -> S = 29.64, efficiency 0.926.
"""

import math

RESULT_FIELDS = [
    "cell",
    "study",
    "status",
    "reason",
    "processes",
    "nodes",
    "world_size",
    "per_device_batch",
    "grad_accum",
    "global_batch",
    "ds_config",
    "zero_stage",
    "train_samples",
    "images_per_s",
    "images_per_s_per_device",
    "epoch_time_s",
    "step_time_median_s",
    "data_wait_fraction",
    "mfu",
    "memory_max_bytes",
    "memory_kind",
    "est_sync_wait_s_total",
    "slowest_rank",
    "simulated_slow_ranks",
    "eval_accuracy",
    "wall_s",
]


def speedup(t1: float, tn: float) -> float:
    return t1 / tn


def strong_efficiency(t1: float, tn: float, n: int) -> float:
    return t1 / (n * tn)


def weak_efficiency(t1: float, tn: float) -> float:
    return t1 / tn


def _num(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _world(row: dict) -> int:
    return int(row.get("world_size") or row["processes"])


def add_scaling_columns(rows: list[dict], kind: str) -> list[dict]:
    """Speedup and efficiency for each ok row against the smallest-world ok row with the same other settings.

    kind: strong | zero (same global batch), weak (efficiency T1/TN), batch | accumulation (same per-device batch;
    with the same data, T1 / (N x TN) is the throughput ratio divided by N, the study's 2-GPU speedup per batch size).
    """

    def key(row):
        # Strong (and ZeRO): the global batch is fixed, so accumulation may differ between rows: not in the key.
        # Weak, batch and accumulation sweeps compare N processes with 1 at the same per-device batch.
        if kind in ("weak", "batch", "accumulation"):
            return (
                str(row.get("per_device_batch")),
                row.get("ds_config"),
                str(row.get("grad_accum")),
                row.get("simulated_slow_ranks"),
            )
        return (str(row.get("global_batch")), row.get("ds_config"), row.get("simulated_slow_ranks"))

    baselines: dict = {}
    for r in rows:
        t = _num(r.get("epoch_time_s"))
        if r.get("status") == "ok" and t and (key(r) not in baselines or _world(r) < baselines[key(r)][0]):
            baselines[key(r)] = (_world(r), t)
    out = []
    for row in rows:
        row = dict(row)
        (w1, t1), tn, n = baselines.get(key(row), (None, None)), _num(row.get("epoch_time_s")), _world(row)
        if row.get("status") == "ok" and t1 and tn:
            row["speedup"] = speedup(t1, tn)
            row["efficiency"] = weak_efficiency(t1, tn) if kind == "weak" else strong_efficiency(t1 * w1, tn, n)
        else:
            row["speedup"] = row["efficiency"] = None
        out.append(row)
    return out


def _fmt(value, spec=".3g") -> str:
    number = _num(value)
    return "–" if number is None else format(number, spec)


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """columns: (header, key, format spec or '' for raw)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [(_fmt(row.get(k), spec) if spec else str(row.get(k, ""))) for _, k, spec in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


STUDY_COLUMNS = [
    ("processes", "processes", ""),
    ("nodes", "nodes", ""),
    ("per-device batch", "per_device_batch", ""),
    ("accum", "grad_accum", ""),
    ("global batch", "global_batch", ""),
    ("engine", "ds_config", ""),
    ("status", "status", ""),
    ("epoch time (s)", "epoch_time_s", ".4g"),
    ("images/s", "images_per_s", ".4g"),
    ("speedup", "speedup", ".3g"),
    ("efficiency", "efficiency", ".3g"),
    ("peak memory (MiB)", "memory_mib", ".4g"),
    ("data wait", "data_wait_fraction", ".1%"),
    ("est. sync wait (s)", "est_sync_wait_s_total", ".3g"),
]


def plot_study(rows: list[dict], kind: str, path: str, caption: str) -> str | None:
    """PNG plot for a study; returns the path (None when matplotlib is missing or nothing succeeded)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    ok = [r for r in rows if r.get("status") == "ok" and _num(r.get("images_per_s"))]
    if not ok:
        return None
    if kind in ("strong", "weak"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ok.sort(key=lambda r: int(r["processes"]))
        n = [int(r["processes"]) for r in ok]
        ips = [float(r["images_per_s"]) for r in ok]
        base = ips[0] / n[0]
        ax1.plot(n, ips, "o-", label="measured")
        ax1.plot(n, [base * k for k in n], "--", color="gray", label="ideal (linear)")
        ax1.set(xlabel="processes", ylabel="images/s", title=f"{kind} scaling: throughput")
        ax1.legend()
        eff = [_num(r.get("efficiency")) for r in ok]
        ax2.plot(n, [e if e is not None else float("nan") for e in eff], "o-", label="measured")
        ax2.axhline(1.0, ls="--", color="gray", label="ideal")
        ax2.set(xlabel="processes", ylabel="efficiency", title=f"{kind} scaling: efficiency", ylim=(0, 1.2))
        ax2.legend()
        for ax in (ax1, ax2):
            ax.set_xticks(n)
    elif kind in ("batch", "accumulation"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        x_key = "per_device_batch" if kind == "batch" else "grad_accum"
        xlabel = "per-device batch" if kind == "batch" else "gradient accumulation steps"
        for procs in sorted({int(r["processes"]) for r in ok}):
            series = sorted(
                (int(r[x_key]), float(r["images_per_s"]), _num(r.get("speedup")))
                for r in ok
                if int(r["processes"]) == procs
            )
            xs = [s[0] for s in series]
            ax1.plot(xs, [s[1] for s in series], "o-", label=f"{procs} process(es)")
            if procs > 1:
                ax2.plot(
                    xs,
                    [s[2] if s[2] is not None else float("nan") for s in series],
                    "o-",
                    label=f"{procs} processes (ideal {procs})",
                )
        ax1.set(xlabel=xlabel, ylabel="images/s", title=f"{kind} sweep: throughput")
        ax2.set(xlabel=xlabel, ylabel="speedup over 1 process", title=f"{kind} sweep: speedup")
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({int(r[x_key]) for r in ok}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.legend()
    else:  # zero comparison: memory against throughput, one point per config
        fig, ax1 = plt.subplots(figsize=(6, 4))
        for r in ok:
            mem = _num(r.get("memory_mib"))
            ax1.scatter(float(r["images_per_s"]), mem)
            ax1.annotate(f"{r['ds_config']} ({r['processes']}p)", (float(r["images_per_s"]), mem))
        kind_of_memory = {"rss_peak_bytes": "peak RSS", "allocated_peak_bytes": "peak allocated"}
        memory = kind_of_memory.get(ok[0].get("memory_kind"), "peak memory") if ok else "peak memory"
        ax1.set(xlabel="images/s", ylabel=f"{memory} per device (MiB)", title="Engines: memory vs throughput")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.text(0.01, 0.01, caption, fontsize=7, wrap=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
