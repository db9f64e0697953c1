"""bert_jax.main's multi-process flags reach jax.distributed.initialize (mocked: no
distributed runtime is started, and no training runs)."""
import json

from tests import test_train_utils as tu

# Runs bert_jax.main.main once per case in one fresh interpreter (absl flags are global)
# and prints, per case, the kwargs jax.distributed.initialize got (None: not called).
_SCRIPT = r"""
import json, sys
from absl import flags
import jax
from bert_jax import main as main_lib
calls = []
jax.distributed.initialize = lambda **kwargs: calls.append(kwargs)
main_lib.run = lambda config, workdir: None
out = {}
for name, args in json.loads(sys.argv[1]).items():
  calls.clear()
  flags.FLAGS.unparse_flags()
  try:
    flags.FLAGS(["main", "--config=configs/tiny_pretrain.py", "--workdir=unused"] + args)
  except flags.Error as e:
    out[name] = "error: " + str(e)
    continue
  main_lib.main(["main"])
  out[name] = calls[0] if calls else None
print(json.dumps(out))
"""

_TWO = ["--num_processes=2", "--process_id=1", "--coordinator_address=host0:1234"]


def _run(cases: dict[str, list[str]], **env) -> dict:
  out = tu.run([tu.sys.executable, "-c", _SCRIPT, json.dumps(cases)], **env).stdout
  return json.loads(out.strip().splitlines()[-1])


def test_local_device_ids_flag_reaches_initialize():
  out = _run({
      "ids": _TWO + ["--local_device_ids=0,1,2,3"],
      "spaces": _TWO + ["--local_device_ids= 4, 5 "],
      "empty": _TWO + ["--local_device_ids="],
      "multihost": ["--multihost", "--local_device_ids=3"],
      "single": ["--local_device_ids=0,1"],
      "bad": _TWO + ["--local_device_ids=0,gpu1"],
  })
  assert out["ids"] == {"initialization_timeout": 300, "heartbeat_timeout_seconds": 60,
                        "coordinator_address": "host0:1234", "num_processes": 2,
                        "process_id": 1, "local_device_ids": [0, 1, 2, 3]}
  assert out["spaces"]["local_device_ids"] == [4, 5]
  assert "local_device_ids" not in out["empty"]  # empty = all of the host's devices
  assert out["multihost"] == {"initialization_timeout": 300, "heartbeat_timeout_seconds": 60,
                              "local_device_ids": [3]}
  assert out["single"] is None  # one process: no distributed runtime at all
  assert out["bad"].startswith("error: ") and "comma-separated integers" in out["bad"]


def test_local_device_ids_default_from_launcher_env():
  """launch/gpu.sh exports JAX_LOCAL_DEVICE_IDS=0,...,G-1 (or the one GPU of a process)."""
  out = _run({"env": _TWO, "flag_wins": _TWO + ["--local_device_ids=7"]},
             JAX_LOCAL_DEVICE_IDS="0,1,2,3,4,5,6,7")
  assert out["env"]["local_device_ids"] == [0, 1, 2, 3, 4, 5, 6, 7]
  assert out["flag_wins"]["local_device_ids"] == [7]
