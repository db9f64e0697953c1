r"""Entry point: BERT pre-training or fine-tuning, as the config file says (config.task).

  python -m bert_jax.main --config=configs/tiny_pretrain.py --workdir=/tmp/bert_tiny
  python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=/tmp/bert_tiny \
      --config.vocab_path=/tmp/bert_tiny/vocab --config.data_dir=CoLA --workdir=/tmp/cola
  python -m bert_jax.main --config=configs/suite.py:glue --config.init_checkpoint=/tmp/bert_tiny \
      --config.vocab_path=/tmp/bert_tiny/vocab --config.data_dir=glue_data --workdir=/tmp/glue

Any config field can be overridden with --config.FIELD=VALUE. Rerunning a command resumes
its workdir; one job at a time may use a workdir.

Several hosts: run the same command on every host with
`--num_processes=N --process_id=I --coordinator_address=HOST0:PORT` (or the env
vars JAX_NUM_PROCESSES / JAX_PROCESS_ID / JAX_COORDINATOR_ADDRESS), or with
`--multihost` where JAX detects the cluster itself (Cloud TPU pods, SLURM).
`--local_device_ids=0,1` (or JAX_LOCAL_DEVICE_IDS) picks the GPUs a process drives.
"""
import os

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from bert_jax import finetune
from bert_jax import history
from bert_jax import process
from bert_jax import suite
from bert_jax import train
from bert_jax import workdir_lock
from common import errors
from common import fileio

_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, summaries and prepared data.")
config_flags.DEFINE_config_file("config", None, "Training configuration file.",
                                lock_config=True)
_MULTIHOST = flags.DEFINE_bool("multihost", False, "jax.distributed.initialize() with "
                               "cluster auto-detection (TPU pods, SLURM).")
_COORDINATOR = flags.DEFINE_string("coordinator_address",
                                   os.environ.get("JAX_COORDINATOR_ADDRESS"),
                                   "host:port of process 0's coordination service.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes",
                                      int(os.environ.get("JAX_NUM_PROCESSES", "1")),
                                      "Number of processes (hosts) in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", int(os.environ.get("JAX_PROCESS_ID", "0")),
                                   "This process's index.")
_LOCAL_DEVICE_IDS = flags.DEFINE_list("local_device_ids",
                                      os.environ.get("JAX_LOCAL_DEVICE_IDS", ""),
                                      "Comma-separated local device ids this process drives "
                                      "(several processes only); empty = all.")
flags.register_validator("local_device_ids", lambda ids: all(i.isdigit() for i in ids),
                         "--local_device_ids must be comma-separated integers, e.g. 0,1,2,3.")
_INIT_TIMEOUT = flags.DEFINE_integer("distributed_init_timeout", 300,
                                     "Seconds to wait for all processes to join.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer("heartbeat_timeout", 60,
                                          "Seconds without a heartbeat before a peer is "
                                          "declared dead and the job fails.")
flags.mark_flags_as_required(["config", "workdir"])


def run(config, workdir: str):
  """The job config.task names: pre-training, a fine-tuning task or the fine-tuning suite
  (holding the workdir's lock: one job per workdir)."""
  init = config.get("init_checkpoint")
  if init and fileio.same_path(init, workdir):
    raise errors.ConfigError(
        f"--config.init_checkpoint={init} is the workdir: the job would write its checkpoints "
        "into the directory it starts from (and a later job reading it would get those "
        "instead); choose another --workdir.")
  with workdir_lock.hold(workdir):
    process.job_compilation_cache(config, workdir)
    if config.task == "pretrain":
      return train.train_and_evaluate(config, workdir)
    if config.task == "suite":
      if config.get("checkpoint_steps"):  # the suite over a run's saved steps
        return history.run_history(config, workdir)
      return suite.run_suite(config, workdir)
    return finetune.finetune(config, workdir)


@errors.reported
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Too many command-line arguments: {argv[1:]}")
  distributed = None
  if _MULTIHOST.value or _NUM_PROCESSES.value > 1:
    distributed = dict(initialization_timeout=_INIT_TIMEOUT.value,
                       heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value)
    if _NUM_PROCESSES.value > 1:
      distributed.update(coordinator_address=_COORDINATOR.value,
                         num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
    if _LOCAL_DEVICE_IDS.value:
      distributed.update(local_device_ids=[int(i) for i in _LOCAL_DEVICE_IDS.value])
  process.setup(distributed)
  run(flags.FLAGS.config, _WORKDIR.value)


if __name__ == "__main__":
  jax.config.config_with_absl()
  errors.run(main)
