"""bert_jax vs KerasHub (Google's maintained BERT on JAX) and the HuggingFace peers, side by side.

    bash bench/setup_keras_peer.sh          # once: /tmp/keraspeer_venv (keras-hub 0.32, same jax)
    bash bench/setup_flax_peer.sh           # once: /tmp/flaxpeer_venv (HF Flax, for `real`)
    python -m bench.peers.keras_peer step         # pre-training step, BERT-base fp32, batch 8 x 128
    python -m bench.peers.keras_peer real         # Gutenberg through each system's input path
    python -m bench.peers.keras_peer step --smoke # seconds: tiny sizes (what the test runs)

`step`: the same synthetic batches (bench.peers.train_step.synthetic_batch: 20 masked slots per
sequence, all positions real). bert_jax: its trainer's jitted pre-training step
(masked LM + NSP, AdamW, clipping). KerasHub: `BertBackbone` + `BertMaskedLM`
(which gathers the masked positions before its head, as bert_jax does), compiled
with keras AdamW (decay off biases and LayerNorm, global clip 1.0) and trained by
`model.fit` on the JAX backend. Each run is its own process, in alternating order
over --rounds rounds. Reported: median step time after warm-up, tokens/s, MFU
(bert_jax's analytic FLOPs for both: the same work) and the time from the start of
model construction to the end of the first step (init, tracing, XLA compilation;
bert_jax's split into its parts).

`real`: Project Gutenberg books (../shared/data/gutenberg, skipped when absent)
through each system's standard input path, counting useful (non-padding) tokens/s
at L=128 (batch 8) and L=512 (batch 2), 15% masking, same model size and AdamW:
- bert_jax: the pre-training job (`python -m bert_jax.main`, configs/default.py) on the
  books prepared by `input_pipeline.prepare` (sentence pairs filled to L, NSP), and
  again with `data.packing=True`; non-padding tokens/s from its progress lines.
- KerasHub: the keras.io pre-training recipe: one paragraph per line,
  `tf.data.TextLineDataset`, paragraphs over 100 characters, batched,
  `BertMaskedLMPreprocessor` (pads or truncates each to L, masks 15%), `model.fit`.
- HuggingFace PyTorch and Flax: run_mlm's path: the text tokenized, concatenated and cut
  into blocks of L (`group_texts`, no padding), masked per batch by the 15% collator;
  `BertForMaskedLM` + AdamW / `FlaxBertForMaskedLM` + optax AdamW in a jitted step.
All with the same WordPiece vocabulary (built on the books, 30,522 entries).

The matmul peak that MFU counts against is the best of several float32 matmul shapes
(square and the model's own) measured before and after the runs, raised to any rate
a run achieved (so MFU never reads above 100%). Appends to bench/results/peers.md unless
--no_record (or --smoke).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench import harness
from bench.peers import hf_peers
from bench.peers.flax_peer import SIZES, run_result  # stdlib only: importable in every venv

REPO = harness.REPO
KERAS_VENV = os.environ.get("KERAS_PEER_VENV", "/tmp/keraspeer_venv")
FLAX_VENV = os.environ.get("FLAX_PEER_VENV", "/tmp/flaxpeer_venv")
GUTENBERG = os.path.join(REPO, "..", "shared", "data", "gutenberg")
PREDICTIONS = {128: 20, 512: 76}
PRELOAD = ""  # --preload: a malloc (e.g. tcmalloc) every run of every system gets


def _result(**kw) -> None:
  harness.emit(kw)


def _synthetic(spec: dict, n: int):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bench.peers.train_step import synthetic_batch  # numpy only: the same batches in every venv
  return synthetic_batch(np.random.default_rng(0), n, spec["L"], spec["preds"], spec["vocab"])


# ---------------------------------------------------------------- KerasHub (its own venv)
def _keras_model(spec: dict):
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  layers, hidden, heads = SIZES[spec["preset"]]
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=spec["vocab"], num_layers=layers, num_heads=heads, hidden_dim=hidden,
      intermediate_dim=4 * hidden, dropout=0.1, max_sequence_length=512)
  model = keras_hub.models.BertMaskedLM(backbone, preprocessor=spec.get("preprocessor"))
  opt = keras.optimizers.AdamW(1e-4, weight_decay=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                               global_clipnorm=1.0)
  opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
  model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=[])
  return model


class _Stamps:
  """A keras callback's timestamps, each after the step's loss is read (as a trainer logs)."""

  def __init__(self):
    import keras  # pylint: disable=g-import-not-at-top
    stamps = self.stamps = []

    class Callback(keras.callbacks.Callback):
      def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])
        stamps.append(time.perf_counter())
    self.callback = Callback()


def _keras_child(spec: dict) -> None:
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  stamps = _Stamps()
  versions = f"keras-hub {keras_hub.__version__}, keras {keras.__version__}, " \
             f"jax {__import__('jax').__version__}"
  steps = spec["warmup"] + spec["steps"]
  if spec["mode"] == "step":
    b = _synthetic(spec, spec["batch"] * steps)
    x = {"token_ids": b["input_ids"], "segment_ids": b["segment_ids"],
         "padding_mask": b["input_mask"].astype(bool), "mask_positions": b["masked_lm_positions"]}
    t0 = time.perf_counter()
    model = _keras_model(spec)
    t_fit = time.perf_counter()
    model.fit(x, b["masked_lm_ids"], sample_weight=b["masked_lm_weights"],
              batch_size=spec["batch"], epochs=1, shuffle=False, verbose=0,
              callbacks=[stamps.callback])
    s = stamps.stamps
    times = [b_ - a for a, b_ in zip(s[spec["warmup"] - 1:], s[spec["warmup"]:])]
    _result(step_s=statistics.median(times), build_s=t_fit - t0, first_step_s=s[0] - t_fit,
            to_first_step_s=s[0] - t0, useful_tokens_per_step=spec["batch"] * spec["L"],
            versions=versions)
    return
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=spec["vocab_file"], lowercase=True)
  pre = keras_hub.models.BertMaskedLMPreprocessor(
      tokenizer, sequence_length=spec["L"], mask_selection_rate=0.15,
      mask_selection_length=spec["preds"])

  def lines():
    return (tf.data.TextLineDataset(spec["paragraphs"])
            .filter(lambda t: tf.strings.length(t) > 100).batch(spec["batch"], drop_remainder=True))
  ds = lines().map(pre, num_parallel_calls=tf.data.AUTOTUNE).repeat().prefetch(tf.data.AUTOTUNE)
  t0 = time.perf_counter()
  model = _keras_model(spec)
  t_fit = time.perf_counter()
  model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[stamps.callback])
  s = stamps.stamps
  elapsed = s[-1] - s[spec["warmup"] - 1]
  # The examples of the timed steps, again: their non-padding tokens (the masks need not match).
  useful = 0  # [CLS] + the paragraph's pieces + [SEP], cut at L: what the packer keeps
  for i, x in enumerate(lines().map(tokenizer).repeat().take(steps)):
    if i >= spec["warmup"]:
      useful += sum(min(len(r) + 2, spec["L"]) for r in x.to_list())
  _result(step_s=elapsed / spec["steps"], useful_tok_s=useful / elapsed,
          tok_s=spec["batch"] * spec["L"] * spec["steps"] / elapsed, build_s=t_fit - t0,
          first_step_s=s[0] - t_fit, versions=versions)


def _keras_finetune_child(spec: dict) -> None:
  """KerasHub's BertTextClassifier on the fine-tuning job's batches (bench/peers/finetune_step.py
  saves them): steps log_every+1 .. steps timed, the loss read on log steps, as a trainer logs."""
  import keras  # pylint: disable=g-import-not-at-top
  import keras_hub  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  data = np.load(spec["batches"])
  steps, every = spec["steps"], spec["log_every"]
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=spec["vocab"], num_layers=spec["layers"], num_heads=spec["heads"],
      hidden_dim=spec["hidden"], intermediate_dim=spec["intermediate"], dropout=0.1,
      max_sequence_length=512)
  model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None,
                                              dropout=0.1)
  warmup = max(1, int(0.1 * spec["total_steps"]))

  class Schedule(keras.optimizers.schedules.LearningRateSchedule):  # 10% warmup, linear decay
    def __call__(self, step):
      step = keras.ops.cast(step, "float32")
      up = step / warmup
      down = (spec["total_steps"] - step) / max(1, spec["total_steps"] - warmup)
      return 2e-5 * keras.ops.maximum(0.0, keras.ops.where(step < warmup, up, down))
  opt = keras.optimizers.AdamW(Schedule(), weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
  opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
  model.compile(optimizer=opt,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x = {"token_ids": data["input_ids"], "segment_ids": data["segment_ids"],
       "padding_mask": data["input_mask"].astype(bool)}
  stamps = {}

  class Callback(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      step = batch + 1
      if step % every == 0 or step == steps:
        float(logs["loss"])
        stamps[step] = time.perf_counter()
  model.fit(x, data["labels"], batch_size=spec["batch"], epochs=1, shuffle=False, verbose=0,
            steps_per_epoch=steps, callbacks=[Callback()])
  elapsed = stamps[steps] - stamps[every]
  _result(s_per_step=elapsed / (steps - every), elapsed=elapsed,
          versions=f"keras-hub {keras_hub.__version__}, keras {keras.__version__}")


def run_keras_finetune(batches: dict, spec: dict, timeout: float = 3600) -> dict:
  """_keras_finetune_child in the KerasHub venv on `batches` (the job's, stacked)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "batches.npz")
    np.savez(path, **batches)
    return _run_child(os.path.join(KERAS_VENV, "bin", "python"), "keras_finetune",
                      dict(spec, batches=path), timeout)


# ---------------------------------------------------------------- bert_jax
def _ours_step_child(spec: dict) -> None:
  """The trainer's step on the synthetic batch, run as the pre-training job runs it
  (bert_jax.main's host-memory settings; the step compiled ahead beside the state's
  initialisation, then the first step)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bench.peers import train_step as ts  # pylint: disable=g-import-not-at-top
  from bert_jax import process as process_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import registry, trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import pretrain as pretrain_data  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  if spec.get("as_job", True):  # what bert_jax.main sets before it runs a job
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    process_lib.reuse_host_memory()
  config = ts.bench_config(spec["preset"], spec["L"], "float32", spec["batch"], spec["vocab"])
  model, objective, sample = registry.pretraining(config)
  trainer = trainer_lib.build(config, model, objective, sample, workdir=None)
  t_build = time.perf_counter()
  if spec.get("ahead", True):
    trainer.compile_ahead(pretrain_data.batch_shapes(config.data, spec["batch"]))
  with trainer.activate():
    state = trainer.init()
    jax.block_until_ready(state)
    t_init = time.perf_counter()
    data = trainer.to_global(_synthetic(spec, spec["batch"]))
    rng = jax.random.key(0)
    stamps = []
    state, metrics, step = trainer_lib.first_step(trainer, state, data, rng)
    float(metrics["loss"])
    stamps.append(time.perf_counter())
    for _ in range(spec["warmup"] + spec["steps"] - 1):
      state, metrics = step(state, data, rng)
      float(metrics["loss"])
      stamps.append(time.perf_counter())
  times = [b - a for a, b in zip(stamps[spec["warmup"] - 1:], stamps[spec["warmup"]:])]
  _result(step_s=statistics.median(times), build_s=t_build - t0, init_s=t_init - t_build,
          first_step_s=stamps[0] - t_build, to_first_step_s=stamps[0] - t0,
          useful_tokens_per_step=spec["batch"] * spec["L"], versions=f"jax {jax.__version__}")


STEP_LINE = r"^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\bstep (\d+)/\d+ \|"
RATES = r"\| ([\d,.]+) tok/s(?: \(([\d,.]+) non-padding\))?"


def _ours_real(spec: dict, workdir: str, packed: bool) -> dict:
  """The pre-training job on the prepared books; useful tokens/s between progress lines."""
  import re  # pylint: disable=g-import-not-at-top
  steps = spec["warmup"] + spec["steps"]
  cmd = [sys.executable, "-m", "bert_jax.main", "--config=configs/default.py",
         f"--workdir={workdir}", f"--config.data.prepared_dir={spec['prepared']}",
         f"--config.data.vocab_path={spec['vocab_file']}",
         f"--config.data.max_seq_length={spec['L']}",
         f"--config.data.max_predictions_per_seq={spec['preds']}",
         f"--config.data.packing={packed}", f"--config.global_batch_size={spec['batch']}",
         f"--config.model.vocab_size={spec['vocab']}", f"--config.model.preset={spec['preset']}",
         "--config.log_every_steps=1", f"--config.num_train_steps={steps}",
         "--config.checkpoint_every_steps=0", "--config.eval_every_steps=0",
         "--config.eval_steps=0", f"--config.max_steps_per_run={steps}"]
  t0 = time.perf_counter()
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  if PRELOAD:
    env["LD_PRELOAD"] = PRELOAD
  proc = subprocess.run(cmd, cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=7200)
  wall = time.perf_counter() - t0
  lines = {}
  for line in proc.stderr.splitlines():
    m = re.match(STEP_LINE, line)
    if m:
      h, mi, s, step = m.groups()
      rates = re.search(RATES, line)
      tok, real = rates.groups() if rates else ("nan", None)
      lines[int(step)] = (int(h) * 3600 + int(mi) * 60 + float(s), float(tok.replace(",", "")),
                          float((real or tok).replace(",", "")))
  first, last = spec["warmup"], steps
  if first not in lines or last not in lines:
    raise RuntimeError(f"{' '.join(cmd)}\nno progress lines at steps {first} and {last} "
                       f"(rc {proc.returncode}):\n{proc.stderr[-3000:]}")
  elapsed = lines[last][0] - lines[first][0]
  # Each line's two rates share one step count and time: their ratio is the step's share of
  # non-padding tokens (the time stamps are when the metrics were read, a step or so late).
  tokens = spec["batch"] * spec["L"]
  useful = sum(tokens * lines[s][2] / lines[s][1] for s in range(first + 1, last + 1))
  return dict(step_s=elapsed / spec["steps"], useful_tok_s=useful / elapsed,
              tok_s=tokens * spec["steps"] / elapsed, job_wall_s=wall)


# ---------------------------------------------------------------- the parent
def _run_child(python: str, kind: str, spec: dict, timeout: float) -> dict:
  if not os.path.exists(python):
    return dict(error=f"no venv python at {python}")
  extra = dict(KERAS_BACKEND="jax", **({"LD_PRELOAD": PRELOAD} if PRELOAD else {}))
  return run_result(
      [python, os.path.abspath(__file__), "--_child", kind, json.dumps(spec)], timeout, **extra)


def books(root: str, max_mb: float) -> list[str]:
  """The Gutenberg books in name order, up to about max_mb megabytes."""
  out, size = [], 0
  for name in sorted(os.listdir(root)):
    if name.endswith(".txt"):
      out.append(os.path.join(root, name))
      size += os.path.getsize(out[-1])
      if size >= max_mb * 1e6:
        break
  return out


def paragraphs_file(files: list[str], path: str) -> int:
  """One paragraph (blank-line separated, its lines joined) per line, as wikitext ships."""
  n = 0
  with open(path, "w", encoding="utf-8") as out:
    for f in files:
      with open(f, encoding="utf-8", errors="replace") as inp:
        for para in inp.read().replace("\r\n", "\n").split("\n\n"):
          text = " ".join(para.split())
          if text:
            out.write(text + "\n")
            n += 1
  return n


def prepare_assets(tmp: str, files: list[str], vocab_size: int) -> dict:
  """One vocabulary for every system; the books prepared for bert_jax; the paragraphs file."""
  vocab_dir = os.path.join(tmp, "vocab")
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  glob = ",".join(files)
  subprocess.run([sys.executable, "-m", "input_pipeline.vocab", f"--input={glob}",
                  f"--output={vocab_dir}", f"--vocab_size={vocab_size}", "--format=paragraphs"],
                 cwd=REPO, env=env, check=True, capture_output=True)
  vocab_file = os.path.join(vocab_dir, "vocab.txt")
  prepared = os.path.join(tmp, "prepared")
  subprocess.run([sys.executable, "-m", "input_pipeline.prepare", f"--input={glob}",
                  f"--vocab={vocab_file}", f"--output_dir={prepared}", "--format=paragraphs",
                  "--num_shards=2", "--num_workers=2"],
                 cwd=REPO, env=env, check=True, capture_output=True)
  words = open(vocab_file, encoding="utf-8").read().splitlines()
  tok_dir = os.path.join(tmp, "hf_tokenizer")  # what the Hub ships for an uncased BERT
  os.makedirs(tok_dir)
  with open(os.path.join(tok_dir, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True,
               "model_max_length": 512}, f)
  paragraphs = os.path.join(tmp, "paragraphs.txt")
  n = paragraphs_file(files, paragraphs)
  return dict(vocab_file=vocab_file, prepared=prepared, tokenizer_dir=tok_dir,
              paragraphs=paragraphs, vocab=len(words), n_paragraphs=n)


def _peak(preset: str, tokens: int) -> float:
  from bench.peers import train_step as ts  # pylint: disable=g-import-not-at-top
  return ts.robust_peak(SIZES[preset][1], tokens)


def _join(outs: list[dict], key: str, digits: int) -> str:
  return ", ".join(f"{o[key]:.{digits}f}" for o in outs)


def _median(outs: list[dict], key: str) -> float:
  vals = [o[key] for o in outs if key in o]
  return statistics.median(vals) if vals else float("nan")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("what", nargs="?", default="step", choices=("step", "real"))
  parser.add_argument("--preset", default="base")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--batch", type=int, default=8, help="step: batch at L=128")
  parser.add_argument("--seq_lens", default="128,512", help="real: lengths")
  parser.add_argument("--batches", default="8,2", help="real: batch per length")
  parser.add_argument("--books_mb", type=float, default=8.0, help="real: text to use")
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--gutenberg", default=GUTENBERG)
  parser.add_argument("--peers", default="keras,torch,flax",
                      help="real: peers (keras, torch, flax); step: keras only")
  parser.add_argument("--timeout", type=float, default=3600)
  parser.add_argument("--preload", default="",
                      help="LD_PRELOAD for every run of every system (e.g. libtcmalloc_minimal.so.4)")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--_child", nargs=2, default=None, help=argparse.SUPPRESS)
  return parser


def _run_step(args, me: str, keras_py: str, load0: str, t_start: float) -> dict:
  """`step`: bert_jax and KerasHub on the synthetic batches, the order alternating by round."""
  L = 128 if not args.smoke else 32
  spec = dict(mode="step", preset=args.preset, L=L, preds=PREDICTIONS.get(L, max(1, L * 15 // 100)),
              batch=args.batch, vocab=args.vocab, steps=args.steps, warmup=args.warmup)
  runs = [("bert_jax", me, "ours_step"), ("KerasHub", keras_py, "keras")]
  results = {name: [] for name, _, _ in runs}
  peak = _peak(args.preset, args.batch * L)
  for r in range(args.rounds):
    order = runs if r % 2 == 0 else runs[::-1]
    for name, python, kind in order:
      out = _run_child(python, kind, spec, args.timeout)
      results[name].append(out)
      print(f"round {r + 1} {name}: {out} (load {harness.load_average()})", flush=True)
  peak = max(peak, _peak(args.preset, args.batch * L))
  return _report_step(args, spec, results, peak, load0, t_start)


def _real_rounds(args, tmp: str, assets: dict, runs: list[tuple]) -> dict:
  """`real` at each length: every run once a round, the order rotating;
  {L: (spec, {name: [its output each round]})}."""
  results = {}
  for L, batch in zip(map(int, args.seq_lens.split(",")), map(int, args.batches.split(","))):
    spec = dict(mode="real", preset=args.preset, L=L, batch=batch, vocab=assets["vocab"],
                preds=PREDICTIONS.get(L, max(1, L * 15 // 100)), steps=args.steps,
                warmup=args.warmup, **{k: assets[k] for k in (
                    "vocab_file", "prepared", "tokenizer_dir", "paragraphs")})
    res = {name: [] for name, _, _ in runs}
    for r in range(args.rounds):
      shift = r % len(runs)
      for i, (name, python, kind) in enumerate(runs[shift:] + runs[:shift]):
        if python is None:
          try:
            out = _ours_real(spec, os.path.join(tmp, f"run_{L}_{r}_{i}"), kind)
          except RuntimeError as e:
            out = dict(error=str(e)[-300:])
        elif kind == "keras":
          out = _run_child(python, "keras", spec, args.timeout)
        else:
          out = _run_child(python, "hf", dict(spec, impl=kind), args.timeout)
        res[name].append(out)
        print(f"L={L} round {r + 1} {name}: {out} (load {harness.load_average()})", flush=True)
    results[L] = (spec, res)
  return results


def _run_real(args, me: str, keras_py: str, flax_py: str, load0: str, t_start: float) -> dict:
  """`real`: the Gutenberg books through bert_jax (plain and packed) and the peers."""
  if not os.path.isdir(args.gutenberg):
    print(f"Gutenberg books not found at {args.gutenberg}: skipped (../shared/data is only on "
          "the project's machines).")
    return {}
  with tempfile.TemporaryDirectory() as tmp:
    files = books(args.gutenberg, args.books_mb)
    t = time.perf_counter()
    assets = prepare_assets(tmp, files, args.vocab)
    print(f"{len(files)} books, {assets['n_paragraphs']} paragraphs, vocabulary {assets['vocab']}: "
          f"{time.perf_counter() - t:.0f} s", flush=True)
    peers = [p for p in args.peers.split(",") if p]
    runs = [("bert_jax", None, False), ("bert_jax packing=True", None, True)]
    runs += [(n, p, k) for n, p, k in (("KerasHub", keras_py, "keras"),
                                       ("HF PyTorch", me, "torch"), ("HF Flax", flax_py, "flax"))
             if k in peers]
    peak = _peak(args.preset, 1024)
    results = _real_rounds(args, tmp, assets, runs)
    peak = max(peak, _peak(args.preset, 1024))
  return _report_real(args, assets, files, results, peak, load0, t_start)


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  if args._child:
    kind, spec = args._child[0], json.loads(args._child[1])
    {"keras": _keras_child, "ours_step": _ours_step_child, "hf": hf_peers.hf_child,
     "keras_finetune": _keras_finetune_child}[kind](spec)
    return {}
  if args.smoke:
    args.preset, args.rounds, args.steps, args.warmup, args.vocab = "tiny", 1, 2, 1, 500
    args.batch, args.seq_lens, args.batches, args.books_mb = 2, "32", "2", 1.0
  global PRELOAD
  PRELOAD = args.preload
  load0, t_start = harness.load_average(), time.time()
  me = sys.executable
  keras_py = os.path.join(KERAS_VENV, "bin", "python")
  flax_py = os.path.join(FLAX_VENV, "bin", "python")
  if args.what == "step":
    return _run_step(args, me, keras_py, load0, t_start)
  return _run_real(args, me, keras_py, flax_py, load0, t_start)


def _report_step(args, spec, results, peak, load0, t_start) -> dict:
  from bert_jax import flops as flops_lib, registry  # pylint: disable=g-import-not-at-top
  from bench.peers import train_step as ts  # pylint: disable=g-import-not-at-top
  config = ts.bench_config(spec["preset"], spec["L"], "float32", spec["batch"], spec["vocab"])
  cfg = registry.pretraining(config)[0].config
  flop = flops_lib.train_flops_per_step(cfg, spec["batch"], spec["L"], spec["preds"])
  tokens = spec["batch"] * spec["L"]
  ok = {n: [o for o in outs if "error" not in o] for n, outs in results.items()}
  best_rate = max((flop / o["step_s"] for outs in ok.values() for o in outs), default=0.0)
  raised = best_rate > peak
  peak = max(peak, best_rate)
  ours = ok["bert_jax"]
  lines = ["| impl | tokens/s (median) | step s per round | MFU | model built s | built to first "
           "step done s (init, trace, compile, run) | start to first step done s | bert_jax "
           "speed / impl (per round) |",
           "|" + "---|" * 8]
  for name, outs in ok.items():
    if not outs:
      lines.append(f"| {name} | unavailable: {results[name][0].get('error', '?')} |||||||")
      continue
    step = _median(outs, "step_s")
    ratios = [o["step_s"] / x["step_s"] for o, x in zip(outs, ours)]
    build, first = _median(outs, "build_s"), _median(outs, "first_step_s")
    detail = (f" (init {_median(outs, 'init_s'):.1f}, the step compiling beside it)"
              if "init_s" in outs[0] else "")
    lines.append(f"| {name} | {tokens / step:.1f} | {_join(outs, 'step_s', 3)} | "
                 f"{100 * flop / step / peak:.1f}% | {build:.1f} | {first:.1f}{detail} | "
                 f"{_median(outs, 'to_first_step_s'):.1f} | "
                 f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x) |")
  versions = "; ".join(f"{n}: {outs[0]['versions']}" for n, outs in ok.items() if outs)
  cmd = "python -m bench.peers.keras_peer step" + (" --smoke" if args.smoke else f" --rounds={args.rounds}") + (
      f" --preload={args.preload}" if args.preload else "")
  text = (f"\n## Pre-training step vs KerasHub ({datetime.date.today()})\n\n"
          f"Command: `{cmd}` (after `bash bench/setup_keras_peer.sh`)  \n"
          f"Machine: {harness.machine()}; load average {load0} at the start, {harness.load_average()} at the end "
          f"({time.time() - t_start:.0f} s); {versions}.  \n"
          f"{spec['preset']}, fp32, batch {spec['batch']} x {spec['L']}, {spec['preds']} masked "
          f"slots, synthetic batches; median of {spec['steps']} steps after {spec['warmup']} warm-up; "
          f"each run its own process, order alternating over {args.rounds} rounds; MFU = "
          f"{flop / 1e9:.1f} analytic GFLOP/step (the same work for both) / the matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s (best float32 matmul shape, before and after"
          f"{'; raised to a rate a run achieved' if raised else ''}).\n\n" + "\n".join(lines) + "\n")
  print(text)
  if not args.no_record and not args.smoke:
    harness.append(__name__, text)
  return {"results": results, "peak": peak, "flop": flop, "text": text}


def _report_real(args, assets, files, results, peak, load0, t_start) -> dict:
  lines = ["| L | batch | impl | useful tokens/s (median) | per round | all tokens/s | padding | "
           "step s | first step s | bert_jax useful tokens/s / impl |", "|" + "---|" * 10]
  versions = {}
  for L, (spec, res) in results.items():
    ours = _median([o for o in res["bert_jax"] if "error" not in o], "useful_tok_s")
    for name, outs in res.items():
      ok = [o for o in outs if "error" not in o]
      if not ok:
        lines.append(f"| {L} | {spec['batch']} | {name} | unavailable: "
                     f"{outs[0].get('error', '?')[-200:]} |||||||")
        continue
      versions.setdefault(name, ok[0].get("versions", ""))
      useful, tok = _median(ok, "useful_tok_s"), _median(ok, "tok_s")
      first = _median(ok, "first_step_s")
      lines.append(f"| {L} | {spec['batch']} | {name} | {useful:.1f} | "
                   f"{_join(ok, 'useful_tok_s', 1)} | {tok:.1f} | "
                   f"{100 * (1 - useful / tok):.0f}% | {_median(ok, 'step_s'):.2f} | "
                   f"{'' if first != first else f'{first:.1f}'} | {ours / useful:.2f}x |")
  cmd = "python -m bench.peers.keras_peer real" + (" --smoke" if args.smoke else f" --rounds={args.rounds}") + (
      f" --preload={args.preload}" if args.preload else "")
  mb = sum(os.path.getsize(f) for f in files) / 1e6
  text = (f"\n## Real data: useful tokens/s vs KerasHub and HuggingFace ({datetime.date.today()})\n\n"
          f"Command: `{cmd}` (after `bash bench/setup_keras_peer.sh` and "
          f"`bash bench/setup_flax_peer.sh`)  \n"
          f"Machine: {harness.machine()}; load average {load0} at the start, {harness.load_average()} at the end "
          f"({time.time() - t_start:.0f} s); "
          + "; ".join(f"{n}: {v}" for n, v in versions.items() if v) + ".  \n"
          f"{args.preset}, fp32; {len(files)} Gutenberg books ({mb:.1f} MB, "
          f"{assets['n_paragraphs']} paragraphs), one WordPiece vocabulary of {assets['vocab']}; "
          f"steps {args.warmup + 1}-{args.warmup + args.steps} of each run timed; each run its own "
          f"process, order rotating over {args.rounds} rounds; matmul peak {peak / 1e9:.1f} GFLOP/s."
          "\n\n" + "\n".join(lines) + "\n")
  print(text)
  if not args.no_record and not args.smoke:
    harness.append(__name__, text)
  return {"results": results, "text": text}


if __name__ == "__main__":
  if __package__ in (None, ""):  # run as a script by a peer venv: make `bench` importable
    sys.path.insert(0, REPO)
  main()
