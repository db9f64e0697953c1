"""launch/gpu.sh and launch/slurm.sbatch, checked in --dry_run mode only."""
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_SH = REPO / "launch" / "gpu.sh"
SBATCH = REPO / "launch" / "slurm.sbatch"
CONFIG = "configs/base_pretrain.py"

# Variables the launcher reads: the tests set exactly the ones they need.
_SCRUB = ("SLURM_", "JAX_", "CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_FLAGS",
          "OMPI_")


def clean_env(**extra):
  env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
  env.update(extra)
  return env


# gpu.sh's default XLA_FLAGS (JAX's GPU performance tips).
DEFAULT_XLA = ("--xla_gpu_enable_latency_hiding_scheduler=true "
               "--xla_gpu_enable_highest_priority_async_stream=true")


def gpu(*args, check=True, **env):
  proc = subprocess.run(["bash", str(GPU_SH), "--dry_run", *args], capture_output=True, text=True,
                        env=clean_env(**env), cwd=REPO, timeout=30)
  if check:
    assert proc.returncode == 0, proc.stdout + proc.stderr
  return proc


def command(stdout):
  """(environment dict, argv) of the one printed '+ env ... python -m bert_jax.main ...' line."""
  [line] = [l for l in stdout.splitlines() if l.startswith("+ ")]
  words = shlex.split(line[2:])
  assert words[0] == "env"
  i = 1
  env = {}
  while "=" in words[i] and not words[i].startswith("-"):
    key, value = words[i].split("=", 1)
    env[key] = value
    i += 1
  return env, words[i:]


def test_single_host():
  proc = gpu(f"--config={CONFIG}", "--workdir=/data/runs/base", "--bf16",
             "--config.global_batch_size=256")
  env, argv = command(proc.stdout)
  assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90", "XLA_FLAGS": DEFAULT_XLA}
  assert argv == ["python3", "-m", "bert_jax.main", f"--config={CONFIG}", "--workdir=/data/runs/base",
                  "--config.model.dtype=bfloat16", "--config.global_batch_size=256"]
  assert "single process" in proc.stdout
  line = next(l for l in proc.stdout.splitlines() if l.startswith("+ "))
  assert line == (f"+ env XLA_PYTHON_CLIENT_MEM_FRACTION=0.90 'XLA_FLAGS={DEFAULT_XLA}' "
                  "python3 -m bert_jax.main "
                  f"--config={CONFIG} --workdir=/data/runs/base --config.model.dtype=bfloat16 "
                  "--config.global_batch_size=256")


def test_single_host_options():
  proc = gpu(f"--config={CONFIG}", "--workdir=gs://b/run", "--cudnn_attention", "--mem_fraction=0.8",
             "--python=/opt/venv/bin/python", "--xla_flags=--xla_gpu_enable_latency_hiding_scheduler=true",
             "--", "--config.data.vocab_path=gs://b/my vocab.txt")
  env, argv = command(proc.stdout)
  assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.8",
                 "XLA_FLAGS": DEFAULT_XLA + " --xla_gpu_enable_latency_hiding_scheduler=true"}
  assert argv == ["/opt/venv/bin/python", "-m", "bert_jax.main", f"--config={CONFIG}",
                  "--workdir=gs://b/run", "--config.model.attention_impl=cudnn",
                  "--config.model.attention_dropout_rate=0.0", "--config.data.vocab_path=gs://b/my vocab.txt"]
  # An XLA_PYTHON_CLIENT_MEM_FRACTION already in the environment is kept.
  env, _ = command(gpu(f"--config={CONFIG}", "--workdir=w",
                       XLA_PYTHON_CLIENT_MEM_FRACTION="0.5").stdout)
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env


@pytest.mark.parametrize("nodelist", ["gpu[01-02]", "gpu01,gpu02"])
def test_two_node_slurm(nodelist):
  proc = gpu(f"--config={CONFIG}", "--workdir=gs://my-bucket/base", "--bf16",
             SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_NODELIST=nodelist, SLURM_JOB_ID="4242",
             SLURM_LOCALID="0", SLURM_GPUS_ON_NODE="8")
  env, argv = command(proc.stdout)
  coordinator = f"gpu01:{61440 + 4242 % 4096}"
  assert argv == ["python3", "-m", "bert_jax.main", f"--config={CONFIG}", "--workdir=gs://my-bucket/base",
                  "--config.model.dtype=bfloat16", f"--coordinator_address={coordinator}",
                  "--num_processes=2", "--process_id=1"]
  assert env == {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.90", "XLA_FLAGS": DEFAULT_XLA,
                 "JAX_COORDINATOR_ADDRESS": coordinator,
                 "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1",
                 "JAX_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7"}
  assert f"process 1 of 2 (8 GPUs on this host), coordinator {coordinator}" in proc.stdout


@pytest.mark.parametrize("nodelist,host", [
    ("node7", "node7"), ("a-b[3-4]", "a-b3"), ("gpu[07,09-12],cpu1", "gpu07"), ("x1,y[1-2]", "x1")])
def test_first_host_of_nodelist(nodelist, host):
  env, argv = command(gpu(f"--config={CONFIG}", "--workdir=w", "--coordinator_port=9999",
                          "--gpus_per_node=2", SLURM_PROCID="0", SLURM_NTASKS="3",
                          SLURM_JOB_NODELIST=nodelist).stdout)
  assert env["JAX_COORDINATOR_ADDRESS"] == f"{host}:9999"
  assert env["JAX_LOCAL_DEVICE_IDS"] == "0,1"
  assert argv[-3:] == [f"--coordinator_address={host}:9999", "--num_processes=3", "--process_id=0"]


def test_explicit_coordinator_without_slurm():
  env, argv = command(gpu(f"--config={CONFIG}", "--workdir=gs://b/run", "--coordinator=10.0.0.2:12345",
                          "--num_processes=2", "--process_id=0", CUDA_VISIBLE_DEVICES="0,1,2,3").stdout)
  assert argv[-3:] == ["--coordinator_address=10.0.0.2:12345", "--num_processes=2", "--process_id=0"]
  assert env["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3"


def test_process_per_gpu():
  env, argv = command(gpu(f"--config={CONFIG}", "--workdir=w", "--process_per_gpu",
                          SLURM_PROCID="5", SLURM_NTASKS="16", SLURM_LOCALID="5",
                          SLURM_NODELIST="gpu[01-02]", SLURM_JOB_ID="1").stdout)
  assert env["JAX_LOCAL_DEVICE_IDS"] == "5"
  assert argv[-3:] == ["--coordinator_address=gpu01:61441", "--num_processes=16", "--process_id=5"]


@pytest.mark.parametrize("args,env,message", [
    ([], {"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}, "--coordinator"),
    (["--num_processes=2", "--process_id=2", "--coordinator=h:1"], {}, "--process_id=2"),
    (["--coordinator=nohost", "--num_processes=2", "--process_id=0"], {}, "HOST:PORT"),
    (["--bogus"], {}, "unknown flag"),
])
def test_bad_arguments(args, env, message):
  proc = gpu(f"--config={CONFIG}", "--workdir=w", *args, check=False, **env)
  assert proc.returncode == 2 and message in proc.stderr
  assert "+ " not in proc.stdout


def test_help():
  proc = subprocess.run(["bash", str(GPU_SH), "--help"], capture_output=True, text=True, timeout=30)
  assert proc.returncode == 0 and proc.stdout.startswith("Usage: bash launch/gpu.sh")


def test_sbatch_example_with_fake_srun(tmp_path):
  """Run the sbatch script with a fake `srun` that starts its command as tasks 0 and 1."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  srun = bin_dir / "srun"
  srun.write_text(
      "#!/bin/bash\n"
      "while [[ $1 == -* ]]; do shift; done\n"
      "for id in 0 1; do SLURM_PROCID=$id SLURM_LOCALID=0 \"$@\" || exit; done\n")
  srun.chmod(0o755)
  env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(REPO),
                  SLURM_JOB_ID="77", SLURM_NTASKS="2", SLURM_JOB_NODELIST="gpu[01-02]",
                  SLURM_GPUS_ON_NODE="8", WORKDIR="gs://my-bucket/bert_base")
  proc = subprocess.run(["bash", str(SBATCH), "--config.num_train_steps=10", "--dry_run"],
                        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = [l for l in proc.stdout.splitlines() if l.startswith("+ ")]
  assert len(lines) == 2
  for process_id, line in enumerate(lines):
    words = shlex.split(line[2:])
    assert words[words.index("-m") + 1:] == [
        "bert_jax.main", "--config=configs/base_pretrain.py", "--workdir=gs://my-bucket/bert_base",
        "--config.model.dtype=bfloat16", "--config.num_train_steps=10",
        "--coordinator_address=gpu01:61517", "--num_processes=2", f"--process_id={process_id}"]


def test_dry_run_after_double_dash_stays_a_dry_run():
  """`--dry_run` written after `--` (meant for the trainer) still makes a dry run."""
  proc = subprocess.run(["bash", str(GPU_SH), f"--config={CONFIG}", "--workdir=/data/run", "--",
                         "--dry_run", "--config.seed=3"], capture_output=True, text=True,
                        env=clean_env(), cwd=REPO, timeout=30)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  _, argv = command(proc.stdout)
  assert argv[-1] == "--config.seed=3" and "--dry_run" not in argv


def test_sbatch_passes_cpus_per_task_to_srun(tmp_path):
  """Slurm >= 22.05: srun does not inherit --cpus-per-task from sbatch; the script passes it."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  calls = tmp_path / "srun_args"
  srun = bin_dir / "srun"
  srun.write_text(f"#!/bin/bash\necho \"$@\" > {calls}\n")
  srun.chmod(0o755)
  env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(REPO),
                  SLURM_CPUS_PER_TASK="32", WORKDIR="gs://my-bucket/bert_base")
  proc = subprocess.run(["bash", str(SBATCH), "--dry_run"], capture_output=True, text=True,
                        env=env, cwd=tmp_path, timeout=30)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  args = calls.read_text().split()
  assert args[:2] == ["--kill-on-bad-exit=1", "--cpus-per-task=32"], args


def test_default_xla_flags_order_and_opt_out():
  """Defaults first, then the environment's XLA_FLAGS, then --xla_flags (a later flag wins)."""
  env, _ = command(gpu(f"--config={CONFIG}", "--workdir=/w", "--xla_flags=--xla_b=1",
                       XLA_FLAGS="--xla_a=1").stdout)
  assert env["XLA_FLAGS"] == DEFAULT_XLA + " --xla_a=1 --xla_b=1"
  env, _ = command(gpu(f"--config={CONFIG}", "--workdir=/w", "--no_default_xla_flags").stdout)
  assert "XLA_FLAGS" not in env


def test_default_xla_flags_are_accepted_by_the_pinned_jaxlib():
  """An XLA flag the jaxlib does not know aborts it at start ("Unknown flag in XLA_FLAGS");
  the defaults must start it (the CPU build registers the GPU flags too)."""
  code = "import jax; jax.numpy.zeros(1).block_until_ready(); print('started')"
  def start(flags):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env(XLA_FLAGS=flags, JAX_PLATFORMS="cpu"))
  ok = start(DEFAULT_XLA)
  assert ok.returncode == 0 and "started" in ok.stdout, ok.stderr[-2000:]
  bad = start("--xla_gpu_no_such_flag_for_this_test=true")
  assert bad.returncode != 0 and "Unknown flag in XLA_FLAGS" in bad.stderr


def test_several_slurm_tasks_per_node_get_one_gpu_each():
  """8 tasks per node without --process_per_gpu: not 8 processes each claiming 8 GPUs."""
  proc = gpu(f"--config={CONFIG}", "--workdir=/w", SLURM_NTASKS="16", SLURM_PROCID="9",
             SLURM_LOCALID="1", SLURM_TASKS_PER_NODE="8(x2)", SLURM_JOB_NODELIST="gpu[01-02]",
             SLURM_JOB_ID="5", SLURM_GPUS_ON_NODE="8")
  env, argv = command(proc.stdout)
  assert env["JAX_LOCAL_DEVICE_IDS"] == "1" and env["JAX_PROCESS_ID"] == "9"
  assert "8 processes on this host: one GPU per process" in proc.stdout


def test_mpirun_ranks_are_read_from_open_mpi():
  proc = gpu(f"--config={CONFIG}", "--workdir=/w", "--coordinator=node0:1234",
             OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_RANK="1",
             OMPI_COMM_WORLD_LOCAL_SIZE="2")
  env, argv = command(proc.stdout)
  assert argv[-3:] == ["--coordinator_address=node0:1234", "--num_processes=4", "--process_id=3"]
  assert env["JAX_LOCAL_DEVICE_IDS"] == "1"
  # Without a coordinator, mpirun has no nodelist: a clear refusal, not N independent runs.
  proc = gpu(f"--config={CONFIG}", "--workdir=/w", check=False, OMPI_COMM_WORLD_SIZE="4",
             OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="2")
  assert proc.returncode != 0 and "under mpirun, pass --coordinator" in proc.stderr


def test_gpu_extras_name_the_cuda_plugins_the_pinned_jax_ships():
  """setup.py's [gpu] and [gpu13] install jax's own CUDA 12 / CUDA 13 extras at the pinned
  version (a renamed or dropped extra would install a CPU-only jax without a word)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  setup = (REPO / "setup.py").read_text()
  pinned = re.search(r'"jax==([\d.]+)"', setup).group(1)
  assert importlib.metadata.version("jax") == pinned
  extras = set(importlib.metadata.metadata("jax").get_all("Provides-Extra"))
  for name, cuda in (("gpu", "cuda12"), ("gpu13", "cuda13")):
    assert f'"{name}": ["jax[{cuda}]=={pinned}"]' in setup, name
    assert cuda in extras, (cuda, sorted(extras))
