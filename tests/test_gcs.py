"""The real entry points with every path on gs://, against a local GCS emulator
(tests/gcs_emulator.py): the README main job (vocabulary, prepared data, checkpoints,
TensorBoard in the bucket; rerun resumes; a corrupt newest checkpoint falls back),
fine-tuning GLUE data on gs:// from a gs:// init_checkpoint into a gs:// workdir,
predict from gs://, convert to and from gs://. Nothing may land in a local ./gs: dir."""
import json
import signal
import subprocess
import sys

import numpy as np
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


@pytest.mark.slow  # the job on gs:// and its rerun (~75 s); the default tier keeps gs:// convert,
# corpus and bad-bucket tests
def test_main_job_on_gs_writes_everything_to_the_bucket_and_resumes(gcs, pretrained):  # noqa: F811
  workdir, log = pretrained
  assert "Training a 512-entry wordpiece vocabulary" in log and "Preparing corpus" in log
  objects = set(gcs.list_objects(workdir))
  for name in ("vocab/vocab.txt", "vocab/COMPLETE", "prepared/summary.json",
               "prepared/tokens.npy", "prepared/sentence_starts.npy",
               "checkpoints/2/config/metadata", "checkpoints/4/state/_METADATA"):
    assert f"{workdir}/{name}" in objects, name
  assert any("events.out.tfevents" in o for o in objects)
  assert not any("/prepared/scratch/" in o for o in objects)
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


@pytest.mark.slow  # a fine-tuning job and predictions on the emulator (~55 s); CI runs the slow tier too
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
  assert {f"{workdir}/best/params.safetensors", f"{workdir}/best/bert_jax_config.json"} <= objects
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


def test_a_workdir_in_a_missing_bucket_is_one_line(gcs, tmp_path):  # noqa: F811
  """Before: a traceback from the storage client. Nothing is written anywhere."""
  out = _run(gcs, tu.main_args("gs://no-such-bucket-here/run"), timeout=120, check=False)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
  (line,) = [l for l in out.stderr.splitlines() if "error:" in l]
  assert line.startswith("main.py: error: --workdir=gs://no-such-bucket-here/run cannot be "
                         "used: the bucket gs://no-such-bucket-here does not exist"), line
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


@pytest.mark.slow
def test_convert_to_and_from_gs(gcs, tmp_path):  # noqa: F811
  transformers = pytest.importorskip("transformers")
  hf = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
      intermediate_size=32, max_position_embeddings=16))
  hf.save_pretrained(tmp_path / "hf")
  # As the Hub ships it: the vocabulary beside the weights (every export carries it).
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]) + "\n")
  root = gcs.fresh_prefix()
  # The CLI three times in one interpreter: HF (local) -> ours (gs) -> HF (gs) -> HF (local).
  calls = [[f"--input={tmp_path / 'hf'}", f"--output={root}/native"],
           [f"--input={root}/native", f"--output={root}/hf", "--to=huggingface"],
           [f"--input={root}/hf", f"--output={tmp_path / 'back'}", "--to=huggingface"]]
  _run(gcs, [sys.executable, "-c", "from bert_jax import convert\n"
             + "".join(f"convert.main({c!r})\n" for c in calls)])
  assert {f"{root}/native/bert_jax_config.json", f"{root}/native/vocab.txt",
          f"{root}/hf/config.json", f"{root}/hf/model.safetensors", f"{root}/hf/vocab.txt",
          f"{root}/hf/tokenizer_config.json"} <= set(gcs.list_objects(root))
  transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
  import torch  # pylint: disable=g-import-not-at-top
  back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "back")
  for name, value in back.state_dict().items():
    assert torch.equal(value, hf.state_dict()[name]), name
  _no_local_gs_dir()


def _download(gcs, gs_prefix, local):  # noqa: F811
  """Copies every object under gs_prefix into the local directory `local`."""
  for name in gcs.list_objects(gs_prefix + "/"):
    if name.endswith("/"):
      continue
    target = local / name[len(gs_prefix) + 1:]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gcs.read_object(name))
  return local


@pytest.mark.slow
def test_kill_9_and_sigterm_on_gs_resume_exactly(gcs, pretrained, tmp_path):  # noqa: F811
  """gs:// workdir: kill -9 while a checkpoint is being written to the bucket, rerun: the
  final parameters equal those of an uninterrupted run bit for bit; SIGTERM saves into the
  bucket and exits 0, and the rerun resumes from that step."""
  run, _ = pretrained
  root = gcs.fresh_prefix()
  settings = {**SHORT, "data.vocab_path": f"{run}/vocab", "data.prepared_dir": f"{run}/prepared",
              "num_train_steps": 8, "checkpoint_every_steps": 2, "keep_checkpoints": 20}
  straight, broken = f"{root}/straight", f"{root}/broken"
  _run(gcs, tu.main_args(straight, **settings))
  env = {**tu.env(1), **gcs.env()}
  proc = subprocess.Popen(tu.main_args(broken, **settings), cwd=tu.REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    tu.wait_for(lambda: any(o.startswith(f"{broken}/checkpoints/4")
                            for o in gcs.list_objects(f"{broken}/checkpoints/")),
                240, "checkpoint 4 in the bucket", proc)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  again = _run(gcs, tu.main_args(broken, **settings)).stderr
  assert "Resumed from" in again and "step 8/8" in again
  a = tu.load_checkpoint(_download(gcs, straight, tmp_path / "straight"), 8)
  b = tu.load_checkpoint(_download(gcs, broken, tmp_path / "broken"), 8)
  fa, fb = tu.flat(a), tu.flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)

  preempted = f"{root}/preempted"
  log = tmp_path / "sigterm.log"
  with open(log, "w") as f:
    proc = subprocess.Popen(
        tu.main_args(preempted, **{**settings, "num_train_steps": 100_000,
                                   "checkpoint_every_steps": 1000, "log_every_steps": 1}),
        cwd=tu.REPO, env=env, stdout=f, stderr=f)
    tu.wait_for(lambda: "step 3/" in log.read_text(), 240, "step 3", proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
  assert "Preempted" in log.read_text()
  names = {o.split("/checkpoints/")[1].split("/")[0]
           for o in gcs.list_objects(f"{preempted}/checkpoints/")}
  steps = sorted(int(n) for n in names if n.isdigit())
  assert len(steps) == 1 and steps[0] >= 3
  resumed = _run(gcs, tu.main_args(preempted, **{**settings, "num_train_steps": steps[0] + 2}))
  assert f"Resumed from {preempted}/checkpoints/{steps[0]}" in resumed.stderr
  _no_local_gs_dir()


_HOST_COPY = r"""
import json, os, sys
import numpy as np
from input_pipeline import data_config, pretrain, store
store._GAP = 0  # Copy exactly the ranges read (the default joins ranges 1 MiB apart).
remote, local, vocab, host = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = data_config.default_data_config()
cfg.vocab_path, cfg.max_seq_length, cfg.max_predictions_per_seq = vocab, 64, 10
equal = []
for split in ("train", "eval"):
  batches = []
  for prepared in (remote, local):
    cfg.prepared_dir = prepared
    it = pretrain.PretrainIterator(cfg, batch_size=8, seed=0, process_index=host,
                                   process_count=2, split=split)
    batches.append([next(it) for _ in range(4)])
    it.close()
  equal.append(all(np.array_equal(a[k], b[k]) for a, b in zip(*batches) for k in a))
cache = os.environ["BERT_JAX_CORPUS_CACHE"]
(entry,) = os.listdir(cache)
copied = {n: sum(b - a for a, b in json.load(open(os.path.join(cache, entry, n + ".ranges.json"))))
          for n in store.FILES}
print(json.dumps({"equal": equal, "copied": copied}))
"""


@pytest.mark.slow  # moved from the default tier (its time: ~12 min on 2 cores)
def test_gs_corpus_host_copies_only_its_documents(gcs, tmp_path):  # noqa: F811
  """A gs:// prepared corpus: each host (its own machine: its own cache) copies the byte
  ranges of its documents, and its batches equal those read from a local copy."""
  from input_pipeline import store  # pylint: disable=g-import-not-at-top
  from input_pipeline import testing  # pylint: disable=g-import-not-at-top
  corpus = testing.make_tagged_corpus(str(tmp_path / "c"), num_docs=16, num_shards=4)
  remote = gcs.fresh_prefix() + "/prepared"
  for name in (*store.FILES, "summary.json"):
    gcs.write_object(f"{remote}/{name}", (tmp_path / "c" / "prepared" / name).read_bytes())
  size = (tmp_path / "c" / "prepared" / store.TOKENS).stat().st_size
  for host in range(2):
    env = {**tu.env(1), **gcs.env(), "BERT_JAX_CORPUS_CACHE": str(tmp_path / f"cache{host}")}
    proc = subprocess.run([sys.executable, "-c", _HOST_COPY, remote, corpus["prepared"],
                           corpus["vocab"], str(host)], cwd=tu.REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["equal"] == [True, True], result
    # Shards host, host + 2 and the 2 held-out documents: well under the whole file.
    assert 0.3 * size < result["copied"][store.TOKENS] < 0.75 * size, (result, size)
  _no_local_gs_dir()


@pytest.mark.parametrize("damage", ["garbage header", "cut short"])
def test_a_damaged_gs_corpus_is_one_line(gcs, tmp_path, damage):  # noqa: F811
  """A gs:// prepared corpus whose tokens.npy has no .npy header or ends early: the local
  copy raised a traceback (ValueError from numpy's header reader, or the copy's own); now
  one line naming the remote file and what to do, exit 2 (issue 56, found in round 13)."""
  from input_pipeline import store  # pylint: disable=g-import-not-at-top
  from input_pipeline import testing  # pylint: disable=g-import-not-at-top
  testing.make_tagged_corpus(str(tmp_path / "c"), num_docs=6, num_shards=2)
  remote = gcs.fresh_prefix() + "/prepared"
  for name in (*store.FILES, "summary.json"):
    data = (tmp_path / "c" / "prepared" / name).read_bytes()
    if name == store.TOKENS:
      data = b"garbage, not an array" * 8 if damage == "garbage header" else data[:-2]
    gcs.write_object(f"{remote}/{name}", data)
  env = {**tu.env(1), **gcs.env(), "BERT_JAX_CORPUS_CACHE": str(tmp_path / "cache")}
  out = subprocess.run([sys.executable, "-m", "input_pipeline.inspect", f"--prepared_dir={remote}",
                        "--num_batches=1", "--max_seq_length=32"], cwd=tu.REPO, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
  (line,) = [l for l in out.stderr.splitlines() if "error:" in l]
  assert f"{remote}/{store.TOKENS} is damaged or incomplete (" in line, line
  assert "Run prepare again" in line, line
  _no_local_gs_dir()
