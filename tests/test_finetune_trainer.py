"""Fine-tuning on the shared trainer: what pre-training has, fine-tuning now has too.

Progress lines with tokens/s, MFU and ETA and TensorBoard train curves; gradient
accumulation and remat; SIGTERM mid-epoch saves, and the rerun ends bit-identical to an
uninterrupted run; two processes on loopback (each feeding its half of every global
batch) fine-tune exactly as one process with two devices, and write predictions once.
Every multi-process run is a subprocess with a timeout (a JAX process whose peer dies
aborts)."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import finetune
from bert_jax.configs import glue
from tests import test_finetune
from tests import test_train_utils as tu
from tests.test_finetune import pretrained  # noqa: F401  pylint: disable=unused-import
from tests.test_multiprocess import run_two_processes

L = 16


def _sst2(tmp_path, n_train=96, n_dev=24):
  data = tmp_path / "SST-2"
  data.mkdir(exist_ok=True)
  rng = np.random.default_rng(0)
  for split, n in (("train", n_train), ("dev", n_dev)):
    rows = test_finetune._sentiment(rng, n)  # pylint: disable=protected-access
    (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
  return data


def _config(tmp_path, pretrained, **overrides):  # noqa: F811
  c = glue.get_config("sst2")
  c.data_dir, c.max_seq_length = str(_sst2(tmp_path)), L
  c.init_checkpoint, c.vocab_path = pretrained
  c.global_batch_size, c.eval_batch_size, c.num_epochs = 8, 8, 2
  c.opt.learning_rate = 3e-3
  for k, v in overrides.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


def _cli(workdir, pretrained, data_dir, **overrides):  # noqa: F811
  settings = {"init_checkpoint": pretrained[0], "vocab_path": pretrained[1], "data_dir": data_dir,
              "max_seq_length": L, "global_batch_size": 8, "eval_batch_size": 8,
              "opt.learning_rate": 3e-3, **overrides}
  return ([sys.executable, "-m", "bert_jax.main", "--config=configs/glue.py:sst2",
           f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in settings.items()])


def test_progress_lines_tensorboard_and_grad_accumulation(tmp_path, pretrained, caplog):  # noqa: F811
  caplog.set_level("INFO")
  c = _config(tmp_path, pretrained, log_every_steps=4,
              **{"model.hidden_dropout_rate": 0.0, "model.attention_dropout_rate": 0.0})
  finetune.finetune(c, str(tmp_path / "one"))
  lines = [r.getMessage() for r in caplog.records if "step 12/24" in r.getMessage()]
  assert lines, [r.getMessage() for r in caplog.records][-20:]
  for field in ("epoch 1 ", "loss", "train_acc", "lr", "grad_norm", "tok/s", "MFU", "ETA"):
    assert field in lines[0], lines[0]
  assert sorted(tu.read_scalars(tmp_path / "one", "train/loss")) == [4, 8, 12, 16, 20, 24]
  assert sorted(tu.read_scalars(tmp_path / "one", "dev/accuracy")) == [12, 24]
  # Two micro-batches of 4 (accumulated inside the step), with remat: the same updates up
  # to float rounding.
  c2 = _config(tmp_path, pretrained, grad_accum_steps=2, log_every_steps=4,
               **{"model.remat": "full", "model.hidden_dropout_rate": 0.0,
                  "model.attention_dropout_rate": 0.0})
  finetune.finetune(c2, str(tmp_path / "two"))
  assert tu.checkpoint_steps(tmp_path / "one")[-1] == tu.checkpoint_steps(tmp_path / "two")[-1] == 24
  a, b = tu.read_scalars(tmp_path / "one", "train/loss"), tu.read_scalars(tmp_path / "two", "train/loss")
  np.testing.assert_allclose([b[s] for s in sorted(b)], [a[s] for s in sorted(a)], rtol=2e-4)
  pa = tu.flat(tu.load_checkpoint(tmp_path / "one", 24)["params"])
  pb = tu.flat(tu.load_checkpoint(tmp_path / "two", 24)["params"])
  for k in pa:
    np.testing.assert_allclose(pb[k], pa[k], rtol=2e-3, atol=2e-5, err_msg=k)


@pytest.mark.slow  # ~50 s (CI runs the slow tier)
def test_sigterm_mid_epoch_then_rerun_is_bit_identical(tmp_path, pretrained):  # noqa: F811
  """Killed with SIGTERM in the middle of an epoch (dropout on): the run saves and exits 0;
  rerunning the same command ends with the parameters and metrics of an uninterrupted run."""
  data = _sst2(tmp_path, n_train=2000)
  args = dict(num_epochs=2, checkpoint_every_steps=100_000, log_every_steps=1)
  straight, broken = tmp_path / "straight", tmp_path / "broken"
  # The fine-tuning job imports no TensorFlow, TFDS or clu (a GPU image has none of them).
  tu.run(tu.without_tensorflow(_cli(straight, pretrained, data, **args)))
  log = tmp_path / "log.txt"
  with open(log, "w") as f:
    proc = subprocess.Popen(_cli(broken, pretrained, data, **args), cwd=tu.REPO, env=tu.env(),
                            stdout=f, stderr=f)
    tu.wait_for(lambda: "step 30/" in log.read_text(), 240, "step 30", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
  text = log.read_text()
  assert "Preempted" in text
  (step,) = tu.checkpoint_steps(broken)
  assert 30 <= step < 250, step  # mid-epoch 1 (250 steps an epoch)
  rerun = tu.run(_cli(broken, pretrained, data, **args)).stderr
  assert f"Resumed from {broken / 'checkpoints'}/{step}" in rerun
  assert tu.checkpoint_steps(straight)[-1] == tu.checkpoint_steps(broken)[-1] == 500
  fa = tu.flat(tu.load_checkpoint(straight, 500))
  fb = tu.flat(tu.load_checkpoint(broken, 500))
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
  ma = json.loads((straight / "metrics.json").read_text())
  mb = json.loads((broken / "metrics.json").read_text())
  assert ma == mb and [e["epoch"] for e in mb["epochs"]] == [1, 2]
  assert (straight / "SST-2.tsv").read_text() == (broken / "SST-2.tsv").read_text()


@pytest.mark.slow  # ~60 s: two processes (CI runs the slow tier)
def test_two_processes_finetune_like_one(tmp_path, pretrained):  # noqa: F811
  """Two 1-device processes, each feeding its 4 rows of every global batch of 8, train
  exactly as one process with 2 devices; dev predictions and metrics are written once."""
  data = _sst2(tmp_path)
  args = dict(num_epochs=2, log_every_steps=4)
  single = tmp_path / "single"
  tu.run(_cli(single, pretrained, data, **args), devices=2)
  multi = tmp_path / "multi"
  run_two_processes(_cli(multi, pretrained, data, **args), tmp_path)
  a, b = tu.read_scalars(single, "train/loss"), tu.read_scalars(multi, "train/loss")
  assert sorted(a) == sorted(b) == [4, 8, 12, 16, 20, 24]
  for step in a:
    assert b[step] == a[step], step  # bit for bit
  assert json.loads((multi / "metrics.json").read_text()) == json.loads(
      (single / "metrics.json").read_text())
  lines = (multi / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 25  # 24 dev rows, once
  assert (multi / "SST-2.tsv").read_text() == (single / "SST-2.tsv").read_text()
  assert (multi / "best" / "config.json").is_file()


def test_a_finetuning_workdir_is_a_checkpoint_like_any_other(tmp_path, pretrained, capsys):  # noqa: F811
  """A fine-tuning workdir's checkpoints carry the model's real BertConfig: predict
  --mode=features and init_checkpoint read its encoder with the right shapes (not those of
  a preset)."""
  from bert_jax import loader, predict  # pylint: disable=g-import-not-at-top
  c = _config(tmp_path, pretrained, num_epochs=1)
  finetune.finetune(c, str(tmp_path / "ft"))
  cfg, params = loader.read(str(tmp_path / "ft"), "encoder")
  assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads) == (32, 2, 2)
  saved = tu.flat(tu.load_checkpoint(tmp_path / "ft")["params"]["bert"])
  loaded = tu.flat(params)
  assert saved.keys() == loaded.keys()
  for k in saved:
    np.testing.assert_array_equal(loaded[k], saved[k], err_msg=k)
  predict.main([f"--checkpoint={tmp_path / 'ft'}", f"--vocab={pretrained[1]}", "--mode=features",
                "--text=the movie was good", f"--output={tmp_path / 'f.npy'}"])
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert out["shape"][-1] == 32
  # And a second fine-tuning run starts from the first one's encoder.
  c2 = _config(tmp_path, pretrained, num_epochs=1)
  c2.init_checkpoint = str(tmp_path / "ft")
  finetune.finetune(c2, str(tmp_path / "ft2"))


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_scanned_layers_finetune_like_unrolled_ones(tmp_path, pretrained):  # noqa: F811
  """model.scan_layers (nn.scan over the encoder layers) fine-tunes the same model: the
  unrolled checkpoint is stacked on the way in, and best/ is written unrolled."""
  from bert_jax import loader  # pylint: disable=g-import-not-at-top
  losses = {}
  for scan in (False, True):
    c = _config(tmp_path, pretrained, log_every_steps=4, num_epochs=1,
                **{"model.scan_layers": scan, "model.hidden_dropout_rate": 0.0,
                   "model.attention_dropout_rate": 0.0})
    finetune.finetune(c, str(tmp_path / f"scan{scan}"))
    losses[scan] = tu.read_scalars(tmp_path / f"scan{scan}", "train/loss")
  assert sorted(losses[True]) == sorted(losses[False]) == [4, 8, 12]
  np.testing.assert_allclose([losses[True][s] for s in (4, 8, 12)],
                             [losses[False][s] for s in (4, 8, 12)], rtol=1e-4)
  cfg, enc = loader.read(str(tmp_path / "scanTrue" / "best"), target="encoder")
  assert not cfg.scan_layers and "layer_1" in enc["encoder"]


def test_convert_cli_reads_a_workdir_of_ours(tmp_path, pretrained):  # noqa: F811
  """The one loader serves the convert CLI too: a fine-tuning workdir's encoder exports."""
  from bert_jax import convert, loader  # pylint: disable=g-import-not-at-top
  finetune.finetune(_config(tmp_path, pretrained, num_epochs=1), str(tmp_path / "ft"))
  convert.main([f"--input={tmp_path / 'ft'}", f"--output={tmp_path / 'enc'}", "--target=encoder"])
  cfg, enc = loader.read(str(tmp_path / "enc"), target="encoder")
  assert (cfg.hidden_size, cfg.num_layers) == (32, 2)
  saved = tu.flat(tu.load_checkpoint(tmp_path / "ft")["params"]["bert"])
  got = tu.flat(enc)
  for k in saved:
    np.testing.assert_array_equal(got[k], saved[k], err_msg=k)


_FAULTS = r"""
import resource, sys, jax, jax.numpy as jnp
from bert_jax import process
jax.config.update("jax_cpu_enable_async_dispatch", sys.argv[1] == "True")  # before the backend starts
applied = process.reuse_host_memory()
f = jax.jit(lambda x: (jnp.sin(x) * 2 + jnp.cos(x)).sum() + jnp.sin(x * 3).sum())  # ~200 MB of temporaries
x = jnp.ones((25_000_000,))
f(x).block_until_ready()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  f(x).block_until_ready()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
"""


@pytest.mark.parametrize("async_dispatch", [pytest.param(False, marks=pytest.mark.slow), True])
def test_reuse_host_memory_stops_page_faults_of_step_temporaries(async_dispatch):
  """Without async dispatch (as bert_jax.main runs), a computation's temporaries come from
  glibc's heap and are reused: repeated runs page-fault nothing (each fresh mmap of a
  100 MB block would be ~25k faults); with it, reuse_host_memory leaves malloc alone.

  Per process the outcome is bimodal: in about one process of three the block is still
  mapped afresh on every run (~73k faults for 3 runs; cause not found, not address-space
  randomization). So up to 8 processes are tried and one must fault nothing; without the
  mallopt settings every process faults (~220k)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  seen = []
  for _ in range(1 if async_dispatch else 8):
    out = subprocess.run([sys.executable, "-c", _FAULTS, str(async_dispatch)], env=env,
                         capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__))).stdout.split()
    applied, faults = out[-2] == "True", int(out[-1])
    seen.append(faults)
    if async_dispatch:
      assert not applied
      return
    assert applied
    if faults < 2000:
      return
  raise AssertionError(f"every process page-faulted its temporaries anew: {seen}")
