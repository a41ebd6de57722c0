"""slurm/scaling_study.sbatch submitted with `sbatch --wait` to a real Slurm cluster that lives in the test's temporary
folder: its own munged (own key and socket), slurmctld and one slurmd per node, all on this machine. Two nodes when
this machine has two names that resolve (its hostname and localhost): Slurm's multiple-slurmd mode runs one slurmd per
node name, each on its own port, so the script's MASTER_ADDR (first name of `scontrol show hostnames`) and node rank
(SLURM_NODEID) are the ones a real cluster would give it. Skipped where Slurm and munge are not installed
(`apt-get install slurm-wlm munge`) or cannot be started here."""

import csv
import getpass
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from hf_vit_scaling import load_throughput_report
from tests.helpers.launchers import REPO, free_port, launch_env

SBATCH_SCRIPT = REPO / "slurm" / "scaling_study.sbatch"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
MISSING = [name for name in DAEMONS if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]

pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"Slurm not installed (no {', '.join(MISSING)}): "
                                "apt-get install slurm-wlm munge")  # fmt: skip

# A strong-scaling grid of one cell (1 process per node) and a tiny ViT on the built-in digits data (no network).
STUDY_ARGS = "--study strong --processes 1 --global_batch_size 16 --ds_configs none --pin_cores false --timeout_s 240"
RECIPE_ARGS = (
    "--model_preset vit-tiny-cpu --image_size 16 --max_steps 8 --throughput_warmup_steps 2 --eval_strategy no "
    "--crop_scale_min 0.5 --dataloader_num_workers 0"
)


def _exe(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _node_names() -> list[str]:
    """Names for the local nodes: each must resolve, as real node names do, since the script hands the first one to
    torchrun as the rendezvous address."""
    names = []
    for name in (platform.node().split(".")[0], "localhost"):
        try:
            socket.gethostbyname(name)
        except OSError:
            continue
        if name and name not in names:
            names.append(name)
    return names


def _tail(path, n=30) -> str:
    try:
        with open(path, errors="replace") as f:
            return f"--- {path}\n" + "".join(f.readlines()[-n:])
    except OSError:
        return f"--- {path}: none"


# Slurm holds a requeued job back until its job credentials have expired: EligibleTime = requeue + cred_expire + 1 s
# (121 s by default, measured here with Slurm 22.05). Starting it earlier (`scontrol update StartTime=now`) failed
# once: "Killing non-startable batch JobId=2: Job credential revoked" (the node still held the revoked credential of
# the killed start). So the private cluster shortens the credential's lifetime instead (slurm.conf(5), AuthInfo).
CRED_EXPIRE_S = 15


def _slurm_conf(root, nodes: list[str], user: str) -> str:
    host = platform.node().split(".")[0] or "localhost"
    node_lines = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 Port={free_port()}" for name in nodes
    )
    return f"""\
ClusterName=vitlocal
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/munge/socket,cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
{node_lines}
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A private cluster: munged, slurmctld and a slurmd per node, started from the folder's slurm.conf and stopped
    (jobs cancelled, daemons terminated) whatever the test's outcome. Yields {env, nodes, root, version, logs}."""
    root = tmp_path_factory.mktemp("slurm")  # short: Slurm and munge put Unix sockets (108-byte paths) in here
    for sub in ("munge", "state", "log", "job"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    nodes = _node_names() or ["localhost"]
    for name in nodes:
        (root / "spool" / name).mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, nodes, getpass.getuser()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []

    def start(name, *args, log):
        out = open(root / "log" / log, "w")
        procs.append(subprocess.Popen([_exe(name), *args], env=env, stdout=out, stderr=subprocess.STDOUT))
        out.close()

    def logs() -> str:
        return "\n".join(_tail(p) for p in sorted((root / "log").iterdir()) + [root / "munge" / "log"])

    try:
        start("munged", "--foreground", "--force", f"--socket={root}/munge/socket", f"--key-file={key}",
              f"--pid-file={root}/munge/pid", f"--log-file={root}/munge/log", f"--seed-file={root}/munge/seed",
              log="munged.out")  # fmt: skip
        deadline = time.time() + 10
        while not (root / "munge" / "socket").exists() and procs[0].poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if not (root / "munge" / "socket").exists():
            pytest.skip(f"munged did not start:\n{logs()}")
        start("slurmctld", "-D", log="slurmctld.out")
        for name in nodes:
            start("slurmd", "-D", "-N", name, log=f"slurmd-{name}.out")
        deadline, states = time.time() + 60, ""
        while time.time() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            sinfo = subprocess.run([_exe("sinfo"), "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True)
            states = sinfo.stdout.strip()
            if sum(line.endswith(" idle") for line in states.splitlines()) == len(nodes):
                break
            time.sleep(0.5)
        else:
            pytest.skip(f"local Slurm cluster did not come up in 60 s (nodes: {states!r}):\n{logs()}")
        if any(p.poll() is not None for p in procs):
            pytest.skip(f"a Slurm or munge daemon exited at start:\n{logs()}")
        version = subprocess.run([_exe("slurmd"), "-V"], capture_output=True, text=True).stdout.strip()
        yield {"env": env, "nodes": nodes, "root": root, "version": version, "logs": logs}
    finally:
        if len(procs) > 1:  # slurmctld was started: cancel what is left of the job, so its processes end too
            try:
                subprocess.run([_exe("scancel"), "--partition=local"], env=env, capture_output=True, timeout=60)
            except subprocess.TimeoutExpired:
                pass
        for proc in reversed(procs):  # slurmds, then slurmctld, then munged
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.distributed
def test_scaling_study_sbatch_runs_on_local_slurm(slurm_cluster, tmp_path):
    nodes, root = slurm_cluster["nodes"], slurm_cluster["root"]
    out = tmp_path / "study"
    env = launch_env(
        SLURM_CONF=slurm_cluster["env"]["SLURM_CONF"],
        PYTHON=sys.executable,
        OUT=str(out),
        MASTER_PORT=str(free_port()),
        STUDY_ARGS=STUDY_ARGS,
        RECIPE_ARGS=RECIPE_ARGS,
    )
    # The script's own #SBATCH lines ask for 4 nodes x 8 GPUs x 64 CPUs; the command line overrides them.
    cmd = [_exe("sbatch"), "--wait", f"--nodes={len(nodes)}", "--gpus-per-node=0", "--cpus-per-task=1",
           f"--chdir={REPO}", f"--output={root}/job/%x-%j.out", str(SBATCH_SCRIPT)]  # fmt: skip
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420, cwd=REPO)
    wall = time.time() - start
    submitted = re.search(r"Submitted batch job (\d+)", proc.stdout)
    assert submitted, f"sbatch did not submit ({proc.returncode}): {proc.stderr}"
    job_id = submitted.group(1)
    job_out = root / "job" / f"vit-scaling-{job_id}.out"
    detail = f"sbatch: {proc.returncode} {proc.stderr}\n{_tail(job_out, 60)}\n{slurm_cluster['logs']()}"
    assert proc.returncode == 0, detail
    state = subprocess.run(
        [_exe("scontrol"), "show", "job", "-o", job_id], env=env, capture_output=True, text=True
    ).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state and f"NumNodes={len(nodes)}" in state, state
    # srun started the study once on every node (each slurmd log shows the launch of the job's step 0).
    for name in nodes:
        assert f"launch task StepId={job_id}.0 " in (root / "log" / f"slurmd-{name}.log").read_text(), detail
    assert "1/1 runs ok" in job_out.read_text(), detail

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["status"], r["nodes"], r["world_size"]) for r in rows] == [("ok", str(len(nodes)), str(len(nodes)))]
    report = load_throughput_report(out / "runs" / rows[0]["cell"] / "throughput.json")
    assert report["setup"]["num_nodes"] == len(nodes)  # distinct (host, node rank): SLURM_NODEID reached torchrun
    assert report["setup"]["world_size"] == len(nodes)
    assert report["throughput"]["images_per_s"] > 0
    print(f"{slurm_cluster['version']}, {len(nodes)} node(s) {nodes}: sbatch --wait took {wall:.0f} s")


# --------------------------------------------------------------------------- slurm/train.sbatch: interrupted, requeued

TRAIN_SCRIPT = REPO / "slurm" / "train.sbatch"
STALL_AT = 5  # the ranks sleep as step 5 starts (HF_VIT_SCALING_FAULTS=stall@5): the signal arrives mid-run


def _job_state(env, job_id: str) -> str:
    return subprocess.run([_exe("scontrol"), "show", "job", "-o", job_id], env=env, capture_output=True,
                          text=True).stdout  # fmt: skip


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("engine", "launcher", "how"),
    [("ddp", "torchrun", "time_limit_signal"), ("zero2", "accelerate", "preemption")],
)
def test_train_sbatch_interrupted_requeued_and_resumed_exactly(slurm_cluster, engine_runs, tmp_path, engine,
                                                               launcher, how):  # fmt: skip
    """slurm/train.sbatch on 2 nodes x 1 process. Once checkpoint-3 is complete the job gets what a cluster sends:
    - time_limit_signal: SIGUSR1 to every process of its steps (`scancel --signal=USR1`, what `--signal=USR1@300`
      sends before the time limit); the ranks save, the script requeues the job;
    - preemption: `scontrol requeue` (what PreemptMode=REQUEUE does): SIGTERM to every process, the ranks save within
      KillWait, Slurm requeues the job.
    The requeued job resumes from the stop's checkpoint by itself and ends with the uninterrupted run's losses at
    every step after it and its final weights (the engine's 2-process run, tests/helpers/engine_runs.py).
    Broken variant it was shown failing on: train.sbatch deleting the checkpoints on a requeue (a silent restart from
    step 1): the log check fails, and with that check off the ranks' traces do ("rank0.jsonl trained [1, ..., 6, 1,
    ..., 12] over the job's two starts")."""
    from hf_vit_scaling.training.checkpoints import checkpoint_problem
    from tests.helpers.engine_runs import ENGINE_RUN_ARGS, ENGINE_STEPS, ENGINES
    from tests.helpers.launchers import RECIPE, TINY_ARGS, losses_by_step, read_json, steps_trained_since
    from tests.launched.test_conformance import checkpoint_weights, first_difference

    nodes, root, cluster_env = slurm_cluster["nodes"], slurm_cluster["root"], slurm_cluster["env"]
    if len(nodes) < 2:
        pytest.skip(f"one node name resolves here ({nodes}): the test needs two")
    reference, _, _ = engine_runs[engine]
    out = tmp_path / "train"
    recipe_args = [*TINY_ARGS, *ENGINES[engine][1], *ENGINE_RUN_ARGS, "--per_device_train_batch_size", "16",
                   "--trace_samples", "true"]  # fmt: skip
    env = launch_env(SLURM_CONF=cluster_env["SLURM_CONF"], PYTHON=sys.executable, OUT=str(out), LAUNCHER=launcher,
                     PROCS_PER_NODE="1", MASTER_PORT=str(free_port()), RECIPE=str(RECIPE),
                     RECIPE_ARGS=" ".join(recipe_args), HF_VIT_SCALING_FAULTS=f"stall@{STALL_AT}")  # fmt: skip
    cmd = [_exe("sbatch"), "--wait", f"--nodes={len(nodes)}", "--gpus-per-node=0", "--cpus-per-task=1",
           f"--chdir={REPO}", f"--output={root}/job/%x-%j.out", str(TRAIN_SCRIPT)]  # fmt: skip
    sbatch = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    submitted = re.search(r"Submitted batch job (\d+)", sbatch.stdout.readline())
    assert submitted, f"sbatch did not submit: {sbatch.stderr.read()}"
    job_id = submitted.group(1)
    job_out = root / "job" / f"vit-train-{job_id}.out"
    try:
        deadline = time.time() + 300
        while checkpoint_problem(str(out / "checkpoint-3")) is not None:
            assert sbatch.poll() is None and time.time() < deadline, f"no checkpoint-3:\n{_tail(job_out, 60)}"
            time.sleep(0.2)
        signal_cmd = ["scancel", "--signal=USR1", job_id] if how == "time_limit_signal" else ["scontrol", "requeue",
                                                                                              job_id]  # fmt: skip
        sent = subprocess.run([_exe(signal_cmd[0]), *signal_cmd[1:]], env=cluster_env, capture_output=True, text=True)
        assert sent.returncode == 0, sent.stderr
        deadline = time.time() + 600
        while sbatch.poll() is None and time.time() < deadline:  # requeued, held CRED_EXPIRE_S + 1 s, started again
            time.sleep(0.5)
        sbatch.wait(timeout=10)
    finally:
        if sbatch.poll() is None:
            sbatch.kill()
    log = job_out.read_text()
    detail = f"{_tail(job_out, 80)}\n{slurm_cluster['logs']()}"
    state = _job_state(cluster_env, job_id)
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state and "Restarts=1" in state, f"{state}\n{detail}"
    stops = re.findall(r"interrupted by (SIGUSR1|SIGTERM) at step (\d+)", log)
    signal_name = "SIGUSR1" if how == "time_limit_signal" else "SIGTERM"
    # One stop, said by the recipe (its main process) and by the script.
    assert {s for s, _ in stops} == {signal_name} and len({step for _, step in stops}) == 1, detail
    step = int(stops[0][1])
    assert 3 < step <= STALL_AT + 1, detail  # the ranks agree one step after the signal
    assert log.count(f"resuming from {out / f'checkpoint-{step}'}") == 1, detail
    assert log.count("start 1 of job") == 1 and log.count("start 2 of job") == 1, detail
    assert f"finished: {out} (job {job_id}, 2 start(s))" in log, detail
    assert read_json(out / "trainer_state.json")["global_step"] == ENGINE_STEPS
    # Provably a resume: each rank's own trace (appended by both starts) lists every step once, 1 to the stop's step
    # from the first start, the rest from the second; a requeued job that restarted from step 1 would list 1-12 again.
    for rank, steps in steps_trained_since(out, {}).items():
        assert steps == list(range(1, ENGINE_STEPS + 1)), f"{rank} trained {steps} over the job's two starts"
    expected, got = losses_by_step(reference), losses_by_step(out)
    for s in range(step + 1, ENGINE_STEPS + 1):
        assert got[s] == pytest.approx(expected[s], rel=1e-5, abs=0), f"step {s}: {got[s]} != {expected[s]}"
    differs = first_difference(checkpoint_weights(reference, reference), checkpoint_weights(out, reference),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    assert differs is None, f"final weights differ at {differs}"
