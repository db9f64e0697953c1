"""launch/tpu.sh and launch/tpu_worker.sh, checked in --dry_run mode only.

A fake `gcloud` (and `gsutil`) that records any call and fails loudly is first on
PATH in every test: dry runs must never execute them.
"""
import os
import pathlib
import shlex
import shutil
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
TPU_SH = LAUNCH / "tpu.sh"
WORKER_SH = LAUNCH / "tpu_worker.sh"

ZONE = "us-central2-b"
PROJECT = "my-proj"
WORKDIR = "gs://my-bucket/bert/base_run1"
CONFIG = "configs/base_pretrain.py"


@pytest.fixture
def fake_bin(tmp_path):
  """A bin dir with gcloud/gsutil (and tar/git/ssh/scp) that record their call and exit 97."""
  bin_dir = tmp_path / "fakebin"
  bin_dir.mkdir()
  marker = tmp_path / "gcloud_called"
  for tool in ("gcloud", "gsutil", "tar", "git", "ssh", "scp"):
    script = bin_dir / tool
    script.write_text(
        "#!/bin/sh\n"
        f'echo "FAKE {tool} INVOKED: $*" >&2\n'
        f'echo "{tool} $*" >> "{marker}"\n'
        "exit 97\n")
    script.chmod(0o755)
  yield bin_dir, marker


@pytest.fixture
def tpu(fake_bin, tmp_path):
  """Runs launch/tpu.sh with the fake gcloud first on PATH; asserts it was never called."""
  bin_dir, marker = fake_bin
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp_path))

  def run(*args, check=True):
    proc = subprocess.run(["bash", str(TPU_SH), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=30)
    if check:
      assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc

  yield run
  assert not marker.exists(), f"dry run executed a cloud command: {marker.read_text()}"


def commands(stdout):
  """The printed commands ('+ ...' lines) as argument lists."""
  return [shlex.split(line[2:], comments=True) for line in stdout.splitlines()
          if line.startswith("+ ")]


def gcloud(stdout):
  return [c for c in commands(stdout) if c[0] == "gcloud"]


def flag(cmd, name):
  """Value of --name=VALUE in an argument list (exactly one occurrence)."""
  values = [a.split("=", 1)[1] for a in cmd if a.startswith(f"--{name}=")]
  assert len(values) == 1, (name, cmd)
  return values[0]


def base(name, accel, *extra):
  return [f"--name={name}", f"--zone={ZONE}", f"--project={PROJECT}",
          f"--accelerator_type={accel}", *extra, "--dry_run"]


def expected_train_command(*overrides, multihost=False):
  """The remote training command, for overrides that need no quoting."""
  assert all(shlex.quote(o) == o for o in overrides)
  return ("cd ~/bert_jax && bash launch/tpu_worker.sh start "
          f"--log_dir={WORKDIR}/logs --log_upload_interval=300 ~/bert_jax_venv/bin/python "
          f"-m bert_jax.main --config={CONFIG} --workdir={WORKDIR}" +
          " --multihost" * multihost + "".join(f" {o}" for o in overrides))


# ------------------------------------------------------------ single host ----

def test_v4_8_single_host(tpu):
  out = tpu("create", *base("bert-v4-8", "v4-8", "--spot")).stdout
  assert "v4-8: 1 host (worker 0), runtime tpu-ubuntu2204-base" in out
  assert gcloud(out) == [[
      "gcloud", "compute", "tpus", "tpu-vm", "create", "bert-v4-8", f"--zone={ZONE}",
      f"--project={PROJECT}", "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base", "--spot"]]

  out = tpu("train", *base("bert-v4-8", "v4-8", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                           "--config.num_train_steps=1000")).stdout
  [cmd] = gcloud(out)
  assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert-v4-8"]
  assert flag(cmd, "zone") == ZONE and flag(cmd, "worker") == "all"
  assert flag(cmd, "command") == expected_train_command("--config.num_train_steps=1000")


def test_dry_run_after_double_dash_stays_a_dry_run(tpu):
  """`--dry_run` written after `--` (among the trainer's arguments) still makes a dry run:
  the fake gcloud is never called (the fixture checks) and the flag is not passed on."""
  args = [f"--name=bert-v4-8", f"--zone={ZONE}", f"--project={PROJECT}", "--accelerator_type=v4-8",
          f"--config={CONFIG}", f"--workdir={WORKDIR}", "--", "--dry_run", "--config.seed=3"]
  out = tpu("train", *args).stdout
  [cmd] = gcloud(out)
  assert flag(cmd, "command") == expected_train_command("--config.seed=3")


def test_ssh_and_scp_reachability_flags(tpu):
  """Projects without external IPs: --internal_ip, or IAP (only `gcloud alpha` has
  --tunnel-through-iap for tpu-vm ssh/scp), plus any extra --ssh_flag, on every ssh/scp."""
  out = tpu("setup", *base("bert-v4-8", "v4-8", "--tunnel_through_iap", "--internal_ip",
                           "--ssh_flag=--strict-host-key-checking=no")).stdout
  cmds = [c for c in gcloud(out) if "ssh" in c or "scp" in c]
  assert len(cmds) == 2  # scp of the checkout, then ssh to install
  for cmd in cmds:
    assert cmd[:5] == ["gcloud", "alpha", "compute", "tpus", "tpu-vm"]
    assert {"--internal-ip", "--tunnel-through-iap", "--strict-host-key-checking=no"} <= set(cmd)
  out = tpu("logs", *base("bert-v4-8", "v4-8", "--nofollow")).stdout
  [cmd] = gcloud(out)
  assert cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--internal-ip" not in cmd and "--tunnel-through-iap" not in cmd


def test_single_host_setup_copies_checkout_and_installs(tpu):
  out = tpu("setup", *base("bert-v4-8", "v4-8")).stdout
  cmds = commands(out)
  assert [c[0] for c in cmds] == ["tar", "gcloud", "gcloud"]
  tarball = cmds[0][cmds[0].index("-czf") + 1]
  scp, ssh = cmds[1], cmds[2]
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5:7] == [tarball, "bert-v4-8:bert_jax_src.tar.gz"]
  assert flag(scp, "worker") == "all"
  assert ssh[4] == "ssh" and flag(ssh, "worker") == "all"
  remote = flag(ssh, "command")
  assert "tar -xzf ~/bert_jax_src.tar.gz -C ~/bert_jax" in remote
  assert "python3.11 -m venv ~/bert_jax_venv" in remote
  assert remote.endswith('~/bert_jax_venv/bin/pip install -c constraints.txt -e ".[tpu]"')


def test_setup_from_git_repo(tpu):
  out = tpu("setup", *base("bert-v4-8", "v4-8", "--repo=https://github.com/me/bert_jax.git",
                           "--ref=v1.2")).stdout
  [ssh] = gcloud(out)
  remote = flag(ssh, "command")
  assert remote.startswith("rm -rf ~/bert_jax && git clone --quiet https://github.com/me/bert_jax.git "
                           "~/bert_jax && git -C ~/bert_jax checkout --quiet v1.2 && ")
  assert 'pip install -c constraints.txt -e ".[tpu]"' in remote
  assert not any(c[0] == "tar" for c in commands(out))


# ---------------------------------------------------------------- v4-32 pod ----

def test_v4_32_pod(tpu):
  name = "bert-pod"
  out = tpu("create", *base(name, "v4-32", "--spot")).stdout
  assert "v4-32: 4 hosts (workers 0..3), runtime tpu-ubuntu2204-base" in out
  [create] = gcloud(out)
  assert flag(create, "accelerator-type") == "v4-32"
  assert flag(create, "version") == "tpu-ubuntu2204-base"
  assert flag(create, "zone") == ZONE and flag(create, "project") == PROJECT
  assert "--spot" in create and "--preemptible" not in create

  out = tpu("setup", *base(name, "v4-32")).stdout
  scp, ssh = gcloud(out)
  assert flag(scp, "worker") == "all" and flag(ssh, "worker") == "all"

  overrides = ["--config.num_train_steps=125000", "--config.global_batch_size=1024",
               "--config.data.tfrecord_pattern=gs://my-bucket/tfrecords/part-*",
               "--config.data.vocab_path=gs://my-bucket/vocab dir/vocab.txt"]
  out = tpu("train", *base(name, "v4-32", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                           *overrides[:2]), "--", *overrides[2:]).stdout
  # One ssh to every worker, with the identical command; nothing per-worker.
  [ssh] = gcloud(out)
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name]
  assert flag(ssh, "worker") == "all"
  remote = flag(ssh, "command")
  assert remote == (
      "cd ~/bert_jax && bash launch/tpu_worker.sh start --log_dir=gs://my-bucket/bert/base_run1/logs"
      " --log_upload_interval=300 ~/bert_jax_venv/bin/python -m bert_jax.main"
      " --config=configs/base_pretrain.py --workdir=gs://my-bucket/bert/base_run1 --multihost"
      " --config.num_train_steps=125000 --config.global_batch_size=1024"
      " --config.data.tfrecord_pattern='gs://my-bucket/tfrecords/part-*'"
      " --config.data.vocab_path='gs://my-bucket/vocab dir/vocab.txt'")
  words = shlex.split(remote)
  assert f"--workdir={WORKDIR}" in words  # gs:// passes through unchanged
  assert words[words.index("-m") + 1:] == [
      "bert_jax.main", f"--config={CONFIG}", f"--workdir={WORKDIR}", "--multihost", *overrides]


def test_v4_32_pod_needs_gs_workdir(tpu):
  proc = tpu("train", *base("bert-pod", "v4-32", f"--config={CONFIG}", "--workdir=/tmp/run"),
             check=False)
  assert proc.returncode == 2 and "gs://" in proc.stderr
  assert not commands(proc.stdout)


def test_v4_32_logs_copy_stop_status_delete(tpu):
  out = tpu("logs", *base("bert-pod", "v4-32", "--worker=3")).stdout
  [ssh] = gcloud(out)
  assert flag(ssh, "worker") == "3"
  assert flag(ssh, "command") == "tail -n 100 -F ~/bert_jax_run/train.log"

  proc = tpu("logs", *base("bert-pod", "v4-32", "--worker=4"), check=False)
  assert proc.returncode == 2 and "workers 0..3" in proc.stderr

  out = tpu("copy", *base("bert-pod", "v4-32", "--to=/tmp/res")).stdout
  scps = gcloud(out)
  assert [flag(c, "worker") for c in scps] == ["0", "1", "2", "3"]
  assert [c[5:7] for c in scps] == [["bert-pod:bert_jax_run/train.log", f"/tmp/res/worker_{w}.log"]
                                    for w in range(4)]

  out = tpu("copy", *base("bert-pod", "v4-32", f"--from={WORKDIR}", "--to=/tmp/res")).stdout
  assert gcloud(out) == [["gcloud", "storage", "cp", "--recursive", WORKDIR, "/tmp/res"]]

  [ssh] = gcloud(tpu("stop", *base("bert-pod", "v4-32")).stdout)
  assert flag(ssh, "worker") == "all"
  assert flag(ssh, "command") == "bash ~/bert_jax/launch/tpu_worker.sh stop --wait=600"

  assert gcloud(tpu("delete", *base("bert-pod", "v4-32")).stdout) == [[
      "gcloud", "compute", "tpus", "tpu-vm", "delete", "bert-pod", f"--zone={ZONE}",
      f"--project={PROJECT}", "--quiet"]]

  describe, ssh = gcloud(tpu("status", *base("bert-pod", "v4-32")).stdout)
  assert describe[4] == "describe" and flag(describe, "format") == "value(state)"
  assert flag(ssh, "worker") == "all"
  assert flag(ssh, "command") == 'echo "$(hostname): $(bash ~/bert_jax/launch/tpu_worker.sh status)"'


# --------------------------------------------------- accelerator table ----

@pytest.mark.parametrize("accel,hosts,runtime", [
    ("v2-8", 1, "tpu-ubuntu2204-base"),
    ("v3-32", 4, "tpu-ubuntu2204-base"),
    ("v4-8", 1, "tpu-ubuntu2204-base"),
    ("v4-16", 2, "tpu-ubuntu2204-base"),
    ("v4-32", 4, "tpu-ubuntu2204-base"),
    ("v5p-8", 1, "v2-alpha-tpuv5"),
    ("v5p-16", 2, "v2-alpha-tpuv5"),
    ("v5litepod-1", 1, "v2-alpha-tpuv5-lite"),
    ("v5litepod-8", 1, "v2-alpha-tpuv5-lite"),
    ("v5litepod-16", 4, "v2-alpha-tpuv5-lite"),
    ("v5litepod-256", 64, "v2-alpha-tpuv5-lite"),
    ("v6e-8", 1, "v2-alpha-tpuv6e"),
    ("v6e-16", 4, "v2-alpha-tpuv6e"),
])
def test_hosts_and_default_runtime(tpu, accel, hosts, runtime):
  out = tpu("create", *base("t", accel)).stdout
  if hosts == 1:
    assert f"{accel}: 1 host (worker 0), runtime {runtime}" in out
  else:
    assert f"{accel}: {hosts} hosts (workers 0..{hosts - 1}), runtime {runtime}" in out
  [create] = gcloud(out)
  assert flag(create, "version") == runtime
  assert "--spot" not in create and "--preemptible" not in create


def test_create_options(tpu):
  [create] = gcloud(tpu("create", "--name=t", f"--zone={ZONE}", "--accelerator_type=v5litepod-16",
                        "--runtime_version=v2-alpha-tpuv5-lite-custom", "--preemptible",
                        "--create_flag=--network=my-net", "--dry_run").stdout)
  assert flag(create, "version") == "v2-alpha-tpuv5-lite-custom"
  assert "--preemptible" in create and "--spot" not in create
  assert create[-1] == "--network=my-net"
  assert not any(a.startswith("--project") for a in create)  # gcloud's default project


@pytest.mark.parametrize("args,message", [
    (["create", "--name=t", f"--zone={ZONE}", "--accelerator_type=v4-12"], "multiples of 8"),
    (["create", "--name=t", f"--zone={ZONE}", "--accelerator_type=tpu-9"], "unknown --accelerator_type"),
    (["create", "--name=t"], "--zone is required"),
    (["create", f"--zone={ZONE}"], "--name is required"),
    (["create", "--name=t", f"--zone={ZONE}", "--spot", "--preemptible"], "exclusive"),
    (["train", "--name=t", f"--zone={ZONE}", f"--workdir={WORKDIR}"], "--config"),
    (["explode", "--name=t"], "unknown action"),
    (["create", "--name=t", f"--zone={ZONE}", "--bogus=1"], "unknown flag"),
])
def test_bad_arguments(tpu, args, message):
  proc = tpu(*args, "--dry_run", check=False)
  assert proc.returncode == 2
  assert message in proc.stderr
  assert not commands(proc.stdout)


def test_help(tpu):
  for args in (["--help"], ["help"], ["train", "--help"]):
    proc = tpu(*args)
    assert proc.stdout.startswith("Usage: bash launch/tpu.sh")
    assert "v5litepod-16: 4" in proc.stdout


def test_fake_gcloud_is_loud(fake_bin, tmp_path):
  """Without --dry_run the script does call gcloud: the fake catches it (so the other tests prove
  that dry runs never call it)."""
  bin_dir, marker = fake_bin
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  proc = subprocess.run(["bash", str(TPU_SH), "delete", "--name=t", f"--zone={ZONE}"],
                        capture_output=True, text=True, env=env, timeout=30)
  assert proc.returncode == 97
  assert "FAKE gcloud INVOKED: compute tpus tpu-vm delete t" in proc.stderr
  assert marker.read_text().startswith("gcloud compute tpus tpu-vm delete t")
  # Injected states are refused outside dry runs (and nothing is called).
  marker.unlink()
  proc = subprocess.run(["bash", str(TPU_SH), "train", "--name=t", f"--zone={ZONE}", f"--config={CONFIG}",
                         f"--workdir={WORKDIR}", "--restart_on_preemption", "--fake_states=READY"],
                        capture_output=True, text=True, env=env, timeout=30)
  assert proc.returncode == 2 and "only for --dry_run" in proc.stderr
  assert not marker.exists()


# ------------------------------------------------ preemption recovery ----

def resilient(tpu, states, train_states, accel="v4-32", check=True):
  return tpu("train", *base("bert-pod", accel, "--spot", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                            "--config.num_train_steps=1000", "--restart_on_preemption",
                            f"--fake_states={states}", f"--fake_train_states={train_states}"),
             check=check)


def actions(stdout):
  """The sequence of actions in a dry run: describe/create/delete/scp/setup/train/status/sleep."""
  seq = []
  for cmd in commands(stdout):
    if cmd[0] == "sleep":
      seq.append("sleep")
    elif cmd[0] == "tar":
      seq.append("pack")
    elif cmd[:4] == ["gcloud", "compute", "tpus", "queued-resources"]:
      seq.append(f"qr_{cmd[4]}")
    elif cmd[:4] == ["gcloud", "compute", "tpus", "tpu-vm"]:
      verb = cmd[4]
      if verb == "ssh":
        remote = flag(cmd, "command")
        verb = ("train" if "tpu_worker.sh start" in remote else
                "train_status" if "tpu_worker.sh status" in remote else
                "setup" if "pip install" in remote else remote)
      seq.append(verb)
    else:
      seq.append(" ".join(cmd))
  return seq


def test_preempted_vm_is_recreated_then_training_finishes(tpu):
  proc = resilient(tpu, "READY,PREEMPTED,READY,READY", "RUNNING,RUNNING,DONE")
  assert actions(proc.stdout) == [
      "describe", "train_status", "sleep",                        # READY, already training
      "describe", "delete", "create", "pack", "scp", "setup", "train", "sleep",  # PREEMPTED
      "describe", "train_status", "sleep",                        # READY, RUNNING
      "describe", "train_status",                                 # READY, DONE -> end
  ]
  assert "recovery 1/100: VM is PREEMPTED" in proc.stdout
  assert "training finished" in proc.stdout
  cmds = gcloud(proc.stdout)
  create = next(c for c in cmds if c[4] == "create")
  assert "--spot" in create and flag(create, "accelerator-type") == "v4-32"
  assert flag(create, "version") == "tpu-ubuntu2204-base"
  # The restarted training is the same command as a plain `train` (resumes from the gs:// workdir).
  train = next(c for c in cmds if c[4] == "ssh" and "tpu_worker.sh start" in flag(c, "command"))
  assert flag(train, "worker") == "all"
  assert flag(train, "command") == expected_train_command("--config.num_train_steps=1000",
                                                          multihost=True)
  plain = gcloud(tpu("train", *base("bert-pod", "v4-32", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                                    "--config.num_train_steps=1000")).stdout)
  assert plain == [train]


def test_terminated_and_missing_vm(tpu):
  proc = resilient(tpu, "TERMINATED,READY", "DONE", accel="v4-8")
  assert actions(proc.stdout) == ["describe", "delete", "create", "pack", "scp", "setup", "train",
                                  "sleep", "describe", "train_status"]
  # A VM that does not exist (yet) is created, not deleted first.
  proc = resilient(tpu, "MISSING,CREATING,READY", "RUNNING", accel="v4-8")
  assert actions(proc.stdout) == ["describe", "create", "pack", "scp", "setup", "train", "sleep",
                                  "describe", "sleep",                  # CREATING: wait
                                  "describe", "train_status", "sleep",  # READY, RUNNING
                                  "describe"]                           # no more injected states
  assert "VM does not exist yet: creating it" in proc.stdout


def test_ready_vm_just_waits_until_training_finished(tpu):
  proc = resilient(tpu, "READY,READY,READY", "RUNNING,RUNNING,DONE")
  assert actions(proc.stdout) == ["describe", "train_status", "sleep",
                                  "describe", "train_status", "sleep",
                                  "describe", "train_status"]
  assert "training finished" in proc.stdout
  # A READY VM with nothing running (fresh after setup): training is started once, then watched.
  proc = resilient(tpu, "READY,READY", "NONE,DONE")
  assert actions(proc.stdout) == ["describe", "train_status", "train", "sleep",
                                  "describe", "train_status"]


def test_training_failure_and_sigterm(tpu):
  proc = resilient(tpu, "READY,READY", "RUNNING,FAILED 1", check=False)
  assert proc.returncode == 1 and "training failed" in proc.stderr
  # SIGTERM-ed (preemption under way) on a VM still READY: start again; next poll sees PREEMPTED.
  proc = resilient(tpu, "READY,READY,PREEMPTED", "RUNNING,STOPPED 0")
  assert actions(proc.stdout) == ["describe", "train_status", "sleep",
                                  "describe", "train_status", "train", "sleep",
                                  "describe", "delete", "create", "pack", "scp", "setup", "train",
                                  "sleep", "describe"]
  assert "no more injected states" in proc.stdout


# ------------------------------------------------- the worker helper ----

def worker(run_dir, *args):
  env = dict(os.environ, BERT_JAX_RUN_DIR=str(run_dir))
  return subprocess.run(["bash", str(WORKER_SH), *args], capture_output=True, text=True, env=env,
                        timeout=30)


def wait_status(run_dir, want, timeout=10.0):
  deadline = time.monotonic() + timeout
  while True:
    status = worker(run_dir, "status").stdout.strip()
    if status == want or time.monotonic() > deadline:
      return status
    time.sleep(0.05)


def test_worker_start_status_stop(tmp_path):
  run_dir = tmp_path / "run"
  assert worker(run_dir, "status").stdout.strip() == "NONE"

  assert worker(run_dir, "start", "bash", "-c", "echo hello from trainer").returncode == 0
  assert wait_status(run_dir, "DONE") == "DONE"
  assert "hello from trainer" in (run_dir / "train.log").read_text()

  worker(run_dir, "start", "bash", "-c", "exit 3")
  assert wait_status(run_dir, "FAILED 3") == "FAILED 3"

  # A trainer that checkpoints on SIGTERM and exits 0 (what bert_jax.main does on preemption).
  trainer = 'trap "echo checkpointing; sleep 0.2; exit 0" TERM; sleep 30 & wait'
  assert worker(run_dir, "start", "bash", "-c", trainer).returncode == 0
  assert wait_status(run_dir, "RUNNING") == "RUNNING"
  second = worker(run_dir, "start", "true")
  assert second.returncode == 1 and "already running" in second.stderr
  stop = worker(run_dir, "stop", "--wait=10")
  assert stop.returncode == 0, stop.stderr
  assert worker(run_dir, "status").stdout.strip() == "STOPPED 0"
  assert "checkpointing" in (run_dir / "train.log").read_text()

  # The process vanished without a word (VM restart): LOST.
  (run_dir / "train.exit").unlink()
  (run_dir / "train.pid").write_text("999999999\n")
  assert worker(run_dir, "status").stdout.strip() == "LOST"


# -------------------------------------------------------------- shellcheck ----

def test_shellcheck():
  shellcheck = shutil.which("shellcheck")
  if shellcheck is None:
    pytest.skip("shellcheck not installed (apt-get install -y shellcheck)")
  scripts = sorted(LAUNCH.glob("*.sh")) + sorted(LAUNCH.glob("*.sbatch"))
  assert len(scripts) >= 4
  proc = subprocess.run([shellcheck, "--shell=bash", *map(str, scripts)], capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_start_frees_a_tpu_held_by_a_stale_process(tmp_path):
  """A process left holding the TPU device (and libtpu's lock file) is stopped before the
  new run starts; the run itself then starts normally."""
  device = tmp_path / "accel0"
  device.write_text("")
  lock = tmp_path / "libtpu_lockfile"
  lock.write_text("")
  stale = subprocess.Popen(["bash", "-c", f"exec 3<{device}; exec sleep 300"])
  try:
    wait_for_open = time.monotonic() + 5
    while time.monotonic() < wait_for_open and not any(
        os.path.realpath(f"/proc/{stale.pid}/fd/{fd}") == str(device)
        for fd in os.listdir(f"/proc/{stale.pid}/fd")):
      time.sleep(0.02)
    env = dict(os.environ, BERT_JAX_RUN_DIR=str(tmp_path / "run"),
               BERT_JAX_TPU_DEVICES=str(tmp_path / "accel*"), BERT_JAX_LIBTPU_LOCKFILE=str(lock))
    proc = subprocess.run(["bash", str(WORKER_SH), "start", "true"], capture_output=True,
                          text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert f"stopping stale process(es) {stale.pid}" in proc.stdout
    assert stale.wait(timeout=10) is not None
    assert not lock.exists() and "stale libtpu lock file" in proc.stdout
    assert wait_status(tmp_path / "run", "DONE") == "DONE"
  finally:
    stale.kill()


def test_recovery_states_not_set_up_stopped_unknown(tpu):
  # A READY VM on which the project was never set up: set it up, then train.
  proc = resilient(tpu, "READY,READY", "NOT_SET_UP,RUNNING")
  assert actions(proc.stdout)[:6] == ["describe", "train_status", "pack", "scp", "setup", "train"]
  assert "not set up on it: setting it up" in proc.stdout
  # STOPPED: started again (not waited on forever); the next poll restarts the training.
  proc = resilient(tpu, "STOPPED,READY", "LOST")
  assert actions(proc.stdout)[:5] == ["describe", "start", "sleep", "describe", "train_status"]
  assert "train" in actions(proc.stdout)[5:]
  # The API's UNKNOWN state is waited on; only a failed query counts as a failure.
  proc = tpu("train", *base("bert-pod", "v4-32", "--spot", f"--config={CONFIG}",
                            f"--workdir={WORKDIR}", "--restart_on_preemption", "--max_failures=2",
                            "--fake_states=UNKNOWN,UNKNOWN,UNKNOWN,QUERY_FAILED,QUERY_FAILED",
                            "--fake_train_states="), check=False)
  assert proc.stdout.count("waiting: VM is UNKNOWN") == 3
  assert proc.returncode == 1 and "giving up after 2 consecutive failures" in proc.stderr


# ----------------------------- capacity back-off and queued resources ----

def sleeps(stdout):
  return [int(c[1]) for c in commands(stdout) if c[0] == "sleep"]


def test_failed_create_backs_off_and_is_not_a_recovery(tpu):
  """No spot capacity: the re-create is retried after 60 s, 120 s, 240 s ... (capped), and the
  whole episode is one recovery, not one per attempt; a create error of another kind is a
  failed step."""
  proc = tpu("train", *base("bert-pod", "v4-32", "--spot", f"--config={CONFIG}",
                            f"--workdir={WORKDIR}", "--restart_on_preemption", "--max_backoff=200",
                            "--fake_states=READY,PREEMPTED,MISSING,MISSING,MISSING,READY",
                            "--fake_train_states=RUNNING,DONE",
                            "--fake_create=NO_CAPACITY,NO_CAPACITY,NO_CAPACITY,OK"))
  assert actions(proc.stdout) == [
      "describe", "train_status", "sleep",
      "describe", "delete", "create", "sleep",          # PREEMPTED: no capacity
      "describe", "create", "sleep",                    # MISSING: no capacity
      "describe", "create", "sleep",                    # MISSING: no capacity
      "describe", "create", "pack", "scp", "setup", "train", "sleep",  # capacity: set up, train
      "describe", "train_status"]                       # DONE
  assert sleeps(proc.stdout) == [60, 60, 120, 200, 60]
  assert proc.stdout.count("recovery 1/100") == 1 and "recovery 2" not in proc.stdout
  assert "step failed" not in proc.stdout
  assert "no capacity for v4-32 in us-central2-b: attempt 3, retrying in 200s" in proc.stdout

  # The total wait for capacity is bounded; the message points at --queued.
  proc = tpu("train", *base("bert-pod", "v4-32", "--spot", f"--config={CONFIG}",
                            f"--workdir={WORKDIR}", "--restart_on_preemption",
                            "--max_capacity_wait=150", "--fake_states=MISSING,MISSING,MISSING,MISSING",
                            "--fake_train_states=", "--fake_create=NO_CAPACITY,NO_CAPACITY,NO_CAPACITY"),
             check=False)
  assert proc.returncode == 1
  assert "no capacity after waiting 180s (--max_capacity_wait=150); --queued" in proc.stderr
  assert sleeps(proc.stdout) == [60, 120]

  # Any other create error is a failed step (and backs off too): it ends at --max_failures.
  proc = tpu("train", *base("bert-pod", "v4-32", "--spot", f"--config={CONFIG}",
                            f"--workdir={WORKDIR}", "--restart_on_preemption", "--max_failures=2",
                            "--fake_states=MISSING,MISSING,MISSING", "--fake_train_states=",
                            "--fake_create=ERROR,ERROR"), check=False)
  assert proc.returncode == 1 and "giving up after 2 consecutive failures" in proc.stderr
  assert "step failed: create (1/2" in proc.stdout


def test_queued_resources_create_delete_status(tpu):
  out = tpu("create", *base("bert-v5e", "v5litepod-16", "--spot", "--queued",
                            "--valid_until_duration=6h", "--create_flag=--network=my-net")).stdout
  assert gcloud(out) == [[
      "gcloud", "compute", "tpus", "queued-resources", "create", "bert-v5e", f"--zone={ZONE}",
      f"--project={PROJECT}", "--node-id=bert-v5e", "--accelerator-type=v5litepod-16",
      "--runtime-version=v2-alpha-tpuv5-lite", "--spot", "--valid-until-duration=6h",
      "--network=my-net"]]
  out = tpu("delete", *base("bert-v5e", "v5litepod-16", "--queued")).stdout
  assert gcloud(out) == [["gcloud", "compute", "tpus", "queued-resources", "delete", "bert-v5e",
                          f"--zone={ZONE}", f"--project={PROJECT}", "--force", "--quiet"]]
  out = tpu("status", *base("bert-v5e", "v5litepod-16", "--queued")).stdout
  describes = [c for c in gcloud(out) if c[4] == "describe"]
  assert [c[3] for c in describes] == ["queued-resources", "tpu-vm"]
  assert flag(describes[0], "format") == "value(state.state)"
  # The ssh/scp of setup and train go to the VM (node id = --name) as usual.
  out = tpu("train", *base("bert-v5e", "v5litepod-16", "--queued", f"--config={CONFIG}",
                           f"--workdir={WORKDIR}")).stdout
  [cmd] = gcloud(out)
  assert cmd[3:6] == ["tpu-vm", "ssh", "bert-v5e"]
  for args, message in [(("--queued", "--preemptible"), "takes --spot"),
                        (("--valid_until_duration=6h",), "needs --queued"),
                        (("--queued", "--valid_until_duration=soon"), "expected a duration")]:
    proc = tpu("create", *base("bert-v5e", "v5litepod-16", *args), check=False)
    assert proc.returncode == 2 and message in proc.stderr


def test_queued_resource_recovery_loop(tpu):
  """--queued --restart_on_preemption: request, wait in the queue, set up and train once ACTIVE,
  and after a spot preemption (SUSPENDED) delete the spent request and queue a new one."""
  proc = tpu("train", *base("bert-v5e", "v5litepod-16", "--spot", "--queued",
                            f"--config={CONFIG}", f"--workdir={WORKDIR}", "--restart_on_preemption",
                            "--fake_states=" + ",".join([
                                "MISSING", "WAITING_FOR_RESOURCES", "PROVISIONING",
                                "ACTIVE", "READY", "ACTIVE", "READY", "SUSPENDING", "SUSPENDED",
                                "WAITING_FOR_RESOURCES", "ACTIVE", "READY", "ACTIVE", "READY"]),
                            "--fake_train_states=NONE,RUNNING,NONE,DONE"))
  assert actions(proc.stdout) == [
      "qr_describe", "qr_create", "sleep",                       # MISSING: request it
      "qr_describe", "sleep", "qr_describe", "sleep",            # queued, provisioning
      "qr_describe", "describe", "pack", "scp", "setup", "train_status", "train", "sleep",
      "qr_describe", "describe", "train_status", "sleep",        # RUNNING
      "qr_describe", "sleep",                                    # SUSPENDING
      "qr_describe", "qr_delete", "qr_create", "sleep",          # SUSPENDED: a new request
      "qr_describe", "sleep",
      "qr_describe", "describe", "scp", "setup", "train_status", "train", "sleep",
      "qr_describe", "describe", "train_status"]                 # DONE
  assert "waiting: queued resource is WAITING_FOR_RESOURCES" in proc.stdout
  assert "recovery 1/100: queued resource SUSPENDED (preempted)" in proc.stdout
  assert "recovery 2" not in proc.stdout
  assert "training finished" in proc.stdout and "delete --name=bert-v5e" in proc.stdout

  # A request that FAILED (not provisioned within --valid_until_duration): deleted and asked
  # again after a back-off, not counted as a recovery.
  proc = tpu("train", *base("bert-v5e", "v5litepod-16", "--spot", "--queued",
                            "--valid_until_duration=2h", f"--config={CONFIG}", f"--workdir={WORKDIR}",
                            "--restart_on_preemption",
                            "--fake_states=FAILED,MISSING,FAILED,MISSING,WAITING_FOR_RESOURCES",
                            "--fake_train_states="))
  assert actions(proc.stdout) == [
      "qr_describe", "qr_delete", "sleep", "qr_describe", "qr_create", "sleep",
      "qr_describe", "qr_delete", "sleep", "qr_describe", "qr_create", "sleep",
      "qr_describe", "sleep", "qr_describe"]
  assert sleeps(proc.stdout) == [60, 60, 120, 60, 60]
  assert "recovery" not in proc.stdout


def test_train_command_copies_worker_logs_to_gs_workdir(tpu):
  out = tpu("train", *base("bert-v4-8", "v4-8", f"--config={CONFIG}", f"--workdir={WORKDIR}/",
                           "--log_upload_interval=60")).stdout
  words = shlex.split(flag(gcloud(out)[0], "command"))
  start = words.index("start")
  assert words[start + 1:start + 3] == [f"--log_dir={WORKDIR}/logs", "--log_upload_interval=60"]
  # A local workdir (single host, no recovery) has no bucket to copy the logs to.
  out = tpu("train", *base("bert-v4-8", "v4-8", f"--config={CONFIG}", "--workdir=/tmp/run")).stdout
  assert "--log_dir" not in flag(gcloud(out)[0], "command")


def test_worker_copies_each_segment_of_the_log_to_the_bucket(tmp_path):
  """`start --log_dir=gs://...` copies this run's part of train.log to
  LOG_DIR/worker_N/<start time>_<pid>.log while it runs and when it exits (also after SIGTERM),
  one file per start; earlier segments are kept."""
  bucket = tmp_path / "gcs"
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "gcloud"
  fake.write_text(
      "#!/bin/bash\n"
      '[[ $1 == storage && $2 == cp && $3 == --quiet && $4 == - ]] || { echo "bad: $*" >&2; exit 2; }\n'
      f'dest="{bucket}/${{5#gs://}}"; mkdir -p "$(dirname "$dest")"; cat > "$dest.tmp"; mv "$dest.tmp" "$dest"\n')
  fake.chmod(0o755)
  run_dir = tmp_path / "run"
  env = dict(os.environ, BERT_JAX_RUN_DIR=str(run_dir), BERT_JAX_WORKER_ID="3",
             PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

  def start(*cmd, interval=1):
    proc = subprocess.run(["bash", str(WORKER_SH), "start", "--log_dir=gs://b/run/logs",
                           f"--log_upload_interval={interval}", *cmd],
                          capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc

  def segments():
    return sorted((bucket / "b/run/logs/worker_3").glob("*.log"))

  # A run that is still going has its log copied every interval.
  trainer = 'echo first segment line; sleep 3; echo first segment end'
  assert "copied to gs://b/run/logs/worker_3/" in start("bash", "-c", trainer).stdout
  deadline = time.monotonic() + 10
  while not segments() and time.monotonic() < deadline:
    time.sleep(0.1)
  [seg1] = segments()
  assert "first segment line" in seg1.read_text()
  assert wait_status(run_dir, "DONE") == "DONE"
  text1 = seg1.read_text()
  assert "first segment end" in text1 and "exit status 0" in text1

  # A second start: a new segment holding only its own output; the first is unchanged.
  time.sleep(1.1)  # a new start-time stamp
  start("bash", "-c", 'trap "echo checkpointing; exit 0" TERM; echo second run; sleep 30 & wait',
        interval=0)
  assert wait_status(run_dir, "RUNNING") == "RUNNING"
  stop = subprocess.run(["bash", str(WORKER_SH), "stop", "--wait=10"], capture_output=True,
                        text=True, env=env, timeout=30)
  assert stop.returncode == 0, stop.stderr
  assert worker(run_dir, "status").stdout.strip() == "STOPPED 0"
  seg1_again, seg2 = segments()
  assert seg1_again == seg1 and seg1.read_text() == text1
  text2 = seg2.read_text()
  assert "second run" in text2 and "checkpointing" in text2 and "exit status 0" in text2
  assert "first segment" not in text2
  # The local log keeps both, and says where the copy went.
  local = (run_dir / "train.log").read_text()
  assert "first segment line" in local and "second run" in local
  assert f"log copied to gs://b/run/logs/worker_3/{seg2.name}" in local


def test_prepare_runs_a_share_on_every_worker(tpu):
  """`prepare`: input_pipeline.prepare_hosts on each worker with its index (worker 0 merges);
  a pod slice's output must be on gs://."""
  args = ["--", "--input=gs://b/c4/*.json.gz", "--vocab=gs://b/vocab",
          "--output_dir=gs://b/prepared/c4", "--num_shards=64"]
  out = tpu("prepare", *base("bert-pod", "v4-32"), *args).stdout
  cmds = gcloud(out)
  assert [flag(c, "worker") for c in cmds] == ["0", "1", "2", "3"]
  for w, cmd in enumerate(cmds):
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert-pod"]
    remote = shlex.split(flag(cmd, "command").split("&&", 1)[1])
    assert remote == ["~/bert_jax_venv/bin/python", "-m", "input_pipeline.prepare_hosts",
                      *args[1:], "--num_hosts=4", f"--host_index={w}"]
  assert "prepared into gs://b/prepared/c4 on 4 worker(s)" in out
  bad = tpu("prepare", *base("bert-pod", "v4-32"), "--", "--input=x", "--output_dir=/tmp/p",
            check=False)
  assert bad.returncode == 2 and "share their output through gs://" in bad.stderr
  one = tpu("prepare", *base("bert-v4-8", "v4-8"), "--", "--input=x", "--vocab=v",
            "--output_dir=/tmp/p").stdout
  [cmd] = gcloud(one)
  assert flag(cmd, "command").endswith("--num_hosts=1 --host_index=0")
  missing = tpu("prepare", *base("bert-v4-8", "v4-8"), check=False)
  assert missing.returncode == 2 and "prepare needs prepare's flags after --" in missing.stderr
