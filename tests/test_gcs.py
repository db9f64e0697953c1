"""The real entry points with every path on gs://, against a local GCS emulator
(tests/gcs_emulator.py): the README main job (vocabulary, prepared data, checkpoints,
TensorBoard in the bucket; rerun resumes; a corrupt newest checkpoint falls back),
fine-tuning GLUE data on gs:// from a gs:// init_checkpoint into a gs:// workdir,
predict from gs://, convert to and from gs://. Nothing may land in a local ./gs: dir."""
import json
import subprocess
import sys

import pytest

from tests import test_main
from tests import test_train_utils as tu
from tests.gcs_emulator import gcs  # noqa: F401  pylint: disable=unused-import

# The README main job shortened as in tests/test_main.py, and shorter still.
SHORT = {**test_main.SHORT, "build.max_chars": 200_000, "global_batch_size": 8,
         "num_train_steps": 4, "checkpoint_every_steps": 2, "log_every_steps": 2,
         "eval_every_steps": 0, "eval_steps": 1, "eval_batch_size": 8}


def _run(gcs, args, timeout=300, check=True):  # noqa: F811
  env = {**tu.env(1), **gcs.env()}
  proc = subprocess.run(args, cwd=tu.REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
  return proc


def _no_local_gs_dir():
  assert not (tu.REPO / "gs:").exists(), "a gs:// path was written to a local ./gs: directory"


@pytest.fixture(scope="module")
def pretrained(gcs):  # noqa: F811
  """The README main job (shortened) with a gs:// workdir; its log."""
  workdir = gcs.fresh_prefix() + "/run"
  log = _run(gcs, tu.main_args(workdir, **SHORT)).stderr
  _no_local_gs_dir()
  return workdir, log


def test_main_job_on_gs_writes_everything_to_the_bucket_and_resumes(gcs, pretrained):  # noqa: F811
  workdir, log = pretrained
  assert "Training a 512-entry wordpiece vocabulary" in log and "Preparing corpus" in log
  objects = set(gcs.list_objects(workdir))
  for name in ("vocab/vocab.txt", "vocab/COMPLETE", "prepared/summary.json",
               "checkpoints/2/config/metadata", "checkpoints/4/state/_METADATA"):
    assert f"{workdir}/{name}" in objects, name
  assert any("events.out.tfevents" in o for o in objects)
  # Rerun: everything is reused, training continues from step 4.
  more = _run(gcs, tu.main_args(workdir, **{**SHORT, "num_train_steps": 6})).stderr
  assert "vocabulary on" not in more and "Preparing corpus" not in more
  assert f"Resumed from {workdir}/checkpoints/4" in more and "step 6/6" in more
  _no_local_gs_dir()


@pytest.mark.slow
def test_corrupt_newest_checkpoint_on_gs_falls_back(gcs, pretrained):  # noqa: F811
  """Newest checkpoint damaged in the bucket: reported, moved aside, the previous one used."""
  workdir, _ = pretrained
  _run(gcs, tu.main_args(workdir, **{**SHORT, "num_train_steps": 6}))
  data = [o for o in gcs.list_objects(f"{workdir}/checkpoints/6/state/")
          if "/d/" in o and not o.endswith("/")]
  assert data
  for o in data:
    gcs.write_object(o, gcs.read_object(o)[:7])
  again = _run(gcs, tu.main_args(workdir, **{**SHORT, "num_train_steps": 6})).stderr
  assert f"Checkpoint {workdir}/checkpoints/6 is unreadable" in again
  assert f"Resumed from {workdir}/checkpoints/4" in again
  assert any(o.startswith(f"{workdir}/checkpoints_corrupt/6/") for o in gcs.list_objects(workdir))
  assert f"{workdir}/checkpoints/6/state/_METADATA" in gcs.list_objects(workdir)  # redone
  _no_local_gs_dir()


def test_finetune_glue_on_gs_then_predict(gcs, pretrained):  # noqa: F811
  run, _ = pretrained
  root = gcs.fresh_prefix()
  for split, n in (("train", 48), ("dev", 16)):
    rows = "".join(f"src\t{i % 2}\t\t{'the module' if i % 2 else 'module the'} returns {i}\n"
                   for i in range(n))
    gcs.write_object(f"{root}/CoLA/{split}.tsv", rows.encode())
  workdir = f"{root}/cola"
  args = [sys.executable, "-m", "bert_jax.main", "--config=configs/glue.py:cola",
          f"--workdir={workdir}", f"--config.init_checkpoint={run}",
          f"--config.vocab_path={run}/vocab", f"--config.data_dir={root}/CoLA",
          "--config.max_seq_length=16", "--config.global_batch_size=8",
          "--config.eval_batch_size=8", "--config.num_epochs=1", "--config.log_every_steps=100"]
  _run(gcs, args)
  objects = set(gcs.list_objects(workdir))
  for name in ("metrics.json", "CoLA.tsv", "best/config.json"):
    assert f"{workdir}/{name}" in objects, name
  assert any(o.startswith(f"{workdir}/best/params/") for o in objects)
  metrics = json.loads(gcs.read_object(f"{workdir}/metrics.json"))
  assert metrics["main_metric"] == "mcc" and len(metrics["epochs"]) == 1
  # predict: classify from the gs:// fine-tuning workdir, fill-mask and features from the
  # gs:// pre-training workdir, texts from and features to gs://.
  gcs.write_object(f"{root}/texts.txt", b"the module returns 3\nmodule the returns 4\n")
  predict = [sys.executable, "-m", "bert_jax.predict", f"--vocab={run}/vocab"]
  out = _run(gcs, predict + [f"--checkpoint={workdir}", "--mode=classify",
                             f"--input_file={root}/texts.txt"]).stdout
  assert [json.loads(l)["prediction"] in ("0", "1") for l in out.splitlines()] == [True, True]
  out = _run(gcs, predict + [f"--checkpoint={run}", "--text=the [MASK] returns"]).stdout
  assert "[MASK] #1:" in out
  _no_local_gs_dir()


@pytest.mark.slow
def test_predict_features_to_gs(gcs, pretrained):  # noqa: F811
  run, _ = pretrained
  root = gcs.fresh_prefix()
  gcs.write_object(f"{root}/texts.txt", b"the module returns 3\nmodule the returns 4\n")
  out = _run(gcs, [sys.executable, "-m", "bert_jax.predict", f"--vocab={run}/vocab",
                   f"--checkpoint={run}", "--mode=features", f"--input_file={root}/texts.txt",
                   f"--output={root}/f.npy"]).stdout
  assert json.loads(out.splitlines()[-1])["output"] == f"{root}/f.npy"
  assert {f"{root}/f.npy", f"{root}/f_mask.npy"} <= set(gcs.list_objects(root))
  _no_local_gs_dir()


def test_convert_to_and_from_gs(gcs, tmp_path):  # noqa: F811
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=32, max_position_embeddings=16))
  hf.save_pretrained(tmp_path / "hf")
  root = gcs.fresh_prefix()
  # The CLI three times in one interpreter: HF (local) -> ours (gs) -> HF (gs) -> HF (local).
  calls = [[f"--input={tmp_path / 'hf'}", f"--output={root}/native"],
           [f"--input={root}/native", f"--output={root}/hf", "--to=huggingface"],
           [f"--input={root}/hf", f"--output={tmp_path / 'back'}", "--to=huggingface"]]
  _run(gcs, [sys.executable, "-c", "from bert_jax import convert\n"
             + "".join(f"convert.main({c!r})\n" for c in calls)])
  assert {f"{root}/native/bert_jax_config.json", f"{root}/hf/config.json",
          f"{root}/hf/model.safetensors"} <= set(gcs.list_objects(root))
  import torch  # pylint: disable=g-import-not-at-top
  back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "back")
  for name, value in back.state_dict().items():
    assert torch.equal(value, hf.state_dict()[name]), name
  _no_local_gs_dir()
