"""Fine-tuning train step on CoLA: bert_jax vs transformers (PyTorch), side by side.

    python -m bench.peers.finetune_step [--rounds=3] [--steps=30] [--other=CHECKOUT]
        [--packed_batch=rows,examples] [--no_record]
    python -m bench.peers.finetune_step --smoke --no_record   # tiny run, seconds of steps (the test)

The recipe of issue #14: all-MiniLM-L6-v2's shape (6 layers, hidden 384, 12 heads,
intermediate 1536, vocabulary 30,522, exact GELU; random weights, no network), CoLA's
in-domain training sentences, L=64, batch 32, fp32, dropout 0.1, AdamW with the
fine-tuning schedule (lr 2e-5, 10% warmup then linear decay, weight decay 0.01 off
biases and LayerNorm, clipping at 1.0).

- bert_jax: the fine-tuning job itself, `python -m bert_jax.main --config=configs/glue.py:cola`
  (host batches, device transfer, metrics read on log steps: all of it), for --steps
  steps; s/step from the timestamps of its progress lines between steps --log_every and
  --steps (compilation excluded). Also with `--config.packing=True`: packed_batch=rows
  (examples/s: the examples of those packed rows, counted with the job's own EpochIterator)
  and packed_batch=examples (each batch of --batch examples packed into the rows it needs);
  --packed_batch=default runs the job with config.packing unset (it packs each batch's
  examples where that saves rows); the plain bert_jax row sets --config.packing=False.
- transformers: BertForSequenceClassification with the same initial encoder (exported
  with bert_jax.models.bert_formats.export_huggingface), torch.optim.AdamW(fused=True: transformers'
  default optimizer), the same schedule and clipping, dropout on, torch.set_num_threads(2),
  on the same batches (the job's tokenizer, features and EpochIterator), timed over the
  same steps, batch building and the loss read included.

Every run is its own subprocess; a round runs each once, in an order that rotates from
round to round. The table has the median s/step over rounds and, per round, transformers'
s/step / bert_jax's (> 1: bert_jax is faster), with its median. Appends the table to
bench/results/peers.md unless --no_record. Needs ../shared/data/cola/raw
(skips otherwise).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

from bench.peers import finetune_throughput
from bench import harness

REPO = pathlib.Path(harness.REPO)
DEFAULT_COLA = finetune_throughput.DEFAULT_COLA
SEED = 0  # configs/common.py: data order and dropout


def make_assets(root: pathlib.Path, cola_dir: str, vocab_size: int,
                shape: str = "minilm") -> dict[str, str]:
  """finetune_throughput's MiniLM-sized checkpoint and CoLA vocabulary, grown to
  `vocab_size` entries ([unusedN] after CoLA's words; 0 = as built) with the exact GELU
  of all-MiniLM-L6-v2, plus the same weights as a HuggingFace directory for transformers.
  shape "roberta-base": random roberta-base weights of that vocabulary instead."""
  from bert_jax import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert_formats  # pylint: disable=g-import-not-at-top
  ckpt, vocab_dir = finetune_throughput.make_checkpoint(root, cola_dir)
  cfg, params = formats.read_native(ckpt)
  words = (pathlib.Path(vocab_dir) / "vocab.txt").read_text().splitlines()
  extra = max(vocab_size - len(words), 0)
  if extra:
    (pathlib.Path(vocab_dir) / "vocab.txt").write_text(
        "\n".join(words + [f"[unused{i}]" for i in range(extra)]) + "\n")
    rng = np.random.default_rng(0)
    emb = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    params["bert"]["embeddings"]["word_embeddings"]["embedding"] = np.concatenate(
        [emb, np.clip(rng.normal(0, 0.02, (extra, emb.shape[1])), -0.04, 0.04).astype(emb.dtype)])
    params["output_bias"] = np.concatenate([params["output_bias"], np.zeros(extra, np.float32)])
  cfg = cfg.replace(vocab_size=len(words) + extra, hidden_act="gelu")
  if shape == "roberta-base":
    return _roberta_assets(root, vocab_dir, cfg.vocab_size)
  if shape == "deberta-v3-base":
    return _deberta_assets(root, vocab_dir, cfg.vocab_size)
  formats.save_native(str(root / "minilm"), cfg, params)
  bert_formats.export_huggingface(str(root / "minilm_hf"), cfg, params)
  return {"ckpt": str(root / "minilm"), "vocab": vocab_dir, "hf": str(root / "minilm_hf")}


def _roberta_assets(root: pathlib.Path, vocab_dir: str, vocab_size: int) -> dict[str, str]:
  """roberta-base's shape (12 layers, hidden 768, positions after the padding index, one
  token type) with random weights, native and as a HuggingFace RoBERTa directory."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.models import bert as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import roberta  # pylint: disable=g-import-not-at-top
  cfg = roberta.RobertaConfig.from_preset("roberta-base", vocab_size=vocab_size)
  ids = jnp.ones((1, 8), jnp.int32)
  params = nn.unbox(model_lib.BertForPreTraining(cfg, nsp=False).init(
      jax.random.key(0), ids, ids, ids, ids))["params"]
  params = jax.tree.map(np.asarray, params)
  formats.save_native(str(root / "roberta"), cfg, params)
  roberta.export_hf(str(root / "roberta_hf"), cfg, params)
  return {"ckpt": str(root / "roberta"), "vocab": vocab_dir, "hf": str(root / "roberta_hf")}


def _deberta_assets(root: pathlib.Path, vocab_dir: str, vocab_size: int) -> dict[str, str]:
  """deberta-v3-base's shape (12 layers, hidden 768, disentangled attention over 256 relative
  buckets, no token types) with random weights, native and as a HuggingFace directory."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.models import deberta  # pylint: disable=g-import-not-at-top
  cfg = deberta.DebertaConfig.from_preset("deberta-v3-base", vocab_size=vocab_size)
  ids = jnp.ones((1, 8), jnp.int32)
  params = nn.unbox(deberta.DebertaForMaskedLM(cfg).init(
      jax.random.key(0), ids, ids, ids, ids))["params"]
  params = jax.tree.map(np.asarray, params)
  formats.save_native(str(root / "deberta"), cfg, params)
  deberta.export_hf(str(root / "deberta_hf"), cfg, params)
  return {"ckpt": str(root / "deberta"), "vocab": vocab_dir, "hf": str(root / "deberta_hf")}


def _features(vocab: str, cola_dir: str, seq_len: int) -> dict[str, np.ndarray]:
  """CoLA's training features exactly as the fine-tuning job builds them."""
  from input_pipeline import glue  # pylint: disable=g-import-not-at-top
  from input_pipeline.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  return glue.encode_examples(glue.read_glue("cola", cola_dir, "train"), Tokenizer.from_path(vocab),
                              seq_len, glue.GLUE["cola"].labels)


def _batches(feats, batch: int, packed: bool, seq_len: int):
  from input_pipeline.epochs import EpochIterator  # pylint: disable=g-import-not-at-top
  return EpochIterator(feats, global_batch_size=batch, num_epochs=1, seed=SEED,
                       max_seq_length=seq_len, max_examples_per_row=8 if packed else 0)


def examples_in_steps(feats, batch: int, seq_len: int, first: int, last: int, packed: bool) -> int:
  """Examples trained on in steps first+1 .. last of the job's epoch."""
  it = _batches(feats, batch, packed, seq_len)
  n = 0
  for step, b in enumerate(it, start=1):
    if step > last:
      break
    if step > first:
      n += int((b["example_weights"] > 0).sum()) if packed else len(b["input_ids"])
  return n


def run_bert_jax(repo: pathlib.Path, assets: dict, cola_dir: str, workdir: str, args,
                 packed: str) -> dict:
  """The fine-tuning job for --steps steps; s/step between progress lines log_every and steps."""
  cmd = [sys.executable, "-m", "bert_jax.main", "--config=configs/glue.py:cola",
         f"--workdir={workdir}", f"--config.init_checkpoint={assets['ckpt']}",
         f"--config.vocab_path={assets['vocab']}", f"--config.data_dir={cola_dir}",
         f"--config.max_seq_length={args.seq_len}", f"--config.global_batch_size={args.batch}",
         f"--config.log_every_steps={args.log_every}", "--config.num_epochs=1",
         f"--config.max_steps_per_run={args.steps}", "--config.checkpoint_every_steps=1000000",
         f"--config.seed={SEED}"] + (
             [] if packed == "default" else [f"--config.packing={bool(packed)}"]) + (
             [f"--config.packed_batch={packed}"] if packed not in ("", "default") else [])
  env = dict(os.environ, PYTHONPATH=str(repo), TF_CPP_MIN_LOG_LEVEL="3")
  return finetune_throughput.job_seconds_per_step(cmd, repo, env, args.log_every, args.steps)


def torch_worker(args) -> None:
  """transformers' train step on the job's batches; prints {"s_per_step", "elapsed", "loss"}."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  torch.manual_seed(SEED)
  feats = _features(args.vocab, args.cola_dir, args.seq_len)
  batches = _batches(feats, args.batch, False, args.seq_len)
  total = batches.steps_per_epoch[0]
  model = transformers.AutoModelForSequenceClassification.from_pretrained(args.hf, num_labels=2)
  model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.1
  model.train()
  no_decay = ("bias", "LayerNorm.weight")
  groups = [{"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)],
             "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=2e-5, eps=1e-6, fused=True)
  schedule = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * total), total)
  stamps, losses = {}, []
  for step in range(1, args.steps + 1):
    b = next(batches)
    if args.torch_padding == "longest":  # as DataCollatorWithPadding: the batch's longest
      n = int(b["input_mask"].sum(-1).max())
      b = {k: v[:, :n] if k in ("input_ids", "segment_ids", "input_mask") else v
           for k, v in b.items()}
    out = model(input_ids=torch.from_numpy(b["input_ids"].astype(np.int64)),
                token_type_ids=torch.from_numpy(b["segment_ids"].astype(np.int64)),
                attention_mask=torch.from_numpy(b["input_mask"].astype(np.int64)),
                labels=torch.from_numpy(b["labels"].astype(np.int64)))
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    schedule.step()
    opt.zero_grad(set_to_none=True)
    losses.append(out.loss.detach())
    if step % args.log_every == 0 or step == args.steps:  # as a trainer logs
      float(torch.stack(losses).mean())
      losses = []
    stamps[step] = time.perf_counter()
  elapsed = stamps[args.steps] - stamps[args.log_every]
  print(json.dumps({"s_per_step": elapsed / (args.steps - args.log_every), "elapsed": elapsed}))


def run_torch(assets: dict, cola_dir: str, args) -> dict:
  cmd = [sys.executable, "-m", "bench.peers.finetune_step", "--worker=torch", f"--hf={assets['hf']}",
         f"--vocab={assets['vocab']}", f"--cola_dir={cola_dir}", f"--steps={args.steps}",
         f"--log_every={args.log_every}", f"--batch={args.batch}", f"--seq_len={args.seq_len}",
         f"--threads={args.threads}", f"--torch_padding={args.torch_padding}"]
  return harness.run_child(cmd, env=harness.child_env(str(REPO)), timeout=3600, mark="")


def run_keras(feats, args) -> dict:
  """KerasHub's BertTextClassifier (bench/peers/keras_peer.py, its own venv) on the job's batches;
  {'error': why} without the venv."""
  from bench.peers import keras_peer  # pylint: disable=g-import-not-at-top
  it = _batches(feats, args.batch, False, args.seq_len)
  rows = [next(it) for _ in range(args.steps)]
  batches = {k: np.concatenate([b[k] for b in rows]) for k in
             ("input_ids", "segment_ids", "input_mask", "labels")}
  size = {"vocab": max(args.vocab_size, int(batches["input_ids"].max()) + 1), "layers": 6,
          "heads": 12, "hidden": 384, "intermediate": 1536}
  return keras_peer.run_keras_finetune(batches, dict(
      size, batch=args.batch, steps=args.steps, log_every=args.log_every,
      total_steps=int(it.steps_per_epoch[0])))


def _smoke_cola(root: pathlib.Path) -> str:
  """A CoLA-shaped directory of 200 short synthetic sentences (the smoke test's data)."""
  rng = np.random.default_rng(0)
  words = "the cat dog sat ran on a mat quickly big small red house tree saw it".split()
  d = root / "cola_smoke"
  d.mkdir()
  for name, n in (("in_domain_train.tsv", 200), ("in_domain_dev.tsv", 20)):
    (d / name).write_text("".join(
        f"gj04\t{rng.integers(0, 2)}\t\t{' '.join(rng.choice(words, rng.integers(3, 9)))}.\n"
        for _ in range(n)))
  return str(d)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cola_dir", default=str(DEFAULT_COLA))
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--log_every", type=int, default=5)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--vocab_size", type=int, default=30522)
  parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  parser.add_argument("--shape", default="minilm",
                      choices=["minilm", "roberta-base", "deberta-v3-base"],
                      help="the model: all-MiniLM-L6-v2's (BERT), roberta-base's (RoBERTa) or "
                      "deberta-v3-base's (DeBERTa-v3; no KerasHub run for either)")
  parser.add_argument("--other", default="", help="also run the bert_jax job of this checkout")
  parser.add_argument("--other_label", default="other")
  parser.add_argument("--no_packed", action="store_true", help="skip the packing=True runs")
  parser.add_argument("--torch_padding", default="max_seq_length",
                      choices=["max_seq_length", "longest"],
                      help="transformers' batches: the job's (every example padded to --seq_len) "
                      "or each cut to its longest example (DataCollatorWithPadding)")
  parser.add_argument("--packed_batch", default="rows",
                      help="the packing=True runs, by what a batch counts (config.packed_batch: "
                      "rows, examples, or both comma-separated); 'default' adds a run with "
                      "config.packing unset (the job's own choice)")
  parser.add_argument("--no_keras", action="store_true",
                      help="skip KerasHub (needs bash bench/setup_keras_peer.sh)")
  parser.add_argument("--smoke", action="store_true",
                      help="synthetic CoLA, 1 round of 4 steps at L=16, batch 4")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--hf", default="", help=argparse.SUPPRESS)
  parser.add_argument("--vocab", default="", help=argparse.SUPPRESS)
  return parser


def _runs(args) -> list[tuple]:
  """(name, repo, packed: "" or config.packed_batch) of each run of a round: repo None is
  transformers, "keras" KerasHub."""
  runs = [("bert_jax", REPO, ""), ("transformers (PyTorch)", None, "")]
  if not args.no_keras and args.shape == "minilm":
    runs.append(("KerasHub (BertTextClassifier)", "keras", ""))
  for mode in ([] if args.no_packed else [m for m in args.packed_batch.split(",") if m]):
    runs.append(("bert_jax, the job's default (packing unset)" if mode == "default" else
                 "bert_jax packing=True" + (" packed_batch=examples" if mode == "examples" else ""),
                 REPO, mode))
  if args.other:
    runs.append((f"bert_jax {args.other_label}", pathlib.Path(args.other), ""))
  return runs


def _run_rounds(args, runs: list[tuple]) -> dict[str, list[dict]]:
  """Every run once a round, the order rotating: {name: [its output each round]}."""
  results = {name: [] for name, _, _ in runs}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    cola = _smoke_cola(tmp) if args.smoke else args.cola_dir
    assets = make_assets(tmp, cola, args.vocab_size, args.shape)
    feats = _features(assets["vocab"], cola, args.seq_len)
    for r in range(args.rounds):
      shift = r % len(runs)
      for i, (name, repo, packed) in enumerate(runs[shift:] + runs[:shift]):
        if repo is None:
          out = run_torch(assets, cola, args)
        elif repo == "keras":
          out = run_keras(feats, args)
          if "error" in out:
            print(f"round {r + 1} {name}: unavailable ({out['error']})", flush=True)
            continue
        else:
          out = run_bert_jax(repo, assets, cola, str(tmp / f"run_{r}_{shift}_{i}"), args, packed)
        n = examples_in_steps(feats, args.batch, args.seq_len, args.log_every, args.steps,
                              packed == "rows")
        out["examples_per_s"] = n / out["elapsed"]
        results[name].append(out)
        print(f"round {r + 1} {name}: {out['s_per_step']:.3f} s/step, "
              f"{out['examples_per_s']:.1f} examples/s (load {harness.load_average()})", flush=True)
  return results


def _rows(results: dict[str, list[dict]], batch: int) -> list[dict]:
  """One table row a run with outputs: medians, and its ratios to transformers and KerasHub."""
  torch_s = [o["s_per_step"] for o in results["transformers (PyTorch)"]]
  keras = [o for name, outs in results.items() if name.startswith("KerasHub") for o in outs]
  rows = []
  for name, outs in results.items():
    if not outs:
      continue
    s = [o["s_per_step"] for o in outs]
    ratios = [t / x for t, x in zip(torch_s, s)]
    ex = [o["examples_per_s"] for o in outs]
    vs_keras = [x / (batch / k["s_per_step"]) for x, k in zip(ex, keras)]
    rows.append({"impl": name, "s_per_step": statistics.median(s), "runs": s,
                 "examples_per_s": statistics.median(ex), "ratio": statistics.median(ratios),
                 "ratios": ratios, "vs_keras": vs_keras})
  return rows


def _table(args, rows: list[dict], load_start: str, t_start: float) -> str:
  """The RESULTS.md section: command, machine, setup and the table."""
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cmd = "python -m bench.peers.finetune_step" + (" --smoke" if args.smoke else
                                           f" --rounds={args.rounds} --steps={args.steps}") + (
      f" --shape={args.shape} --vocab_size={args.vocab_size} --log_every={args.log_every}"
      if args.shape != "minilm" else "") + (
      f" --other=<checkout of {args.other_label}>" if args.other else "") + (
      " --no_packed" if args.no_packed else "") + (
      f" --packed_batch={args.packed_batch}" if args.packed_batch != "rows" else "") + (
      " --torch_padding=longest" if args.torch_padding == "longest" else "")
  return (
      f"\n## Fine-tuning step vs transformers, CoLA ({datetime.date.today()})\n\n"
      f"Command: `{cmd}`  \n"
      f"Machine: {harness.machine()}; load average (1/5/15 min) {load_start} at the start, "
      f"{harness.load_average()} "
      f"at the end ({time.time() - t_start:.0f} s); jax {jax.__version__}, torch "
      f"{torch.__version__}, transformers {transformers.__version__}.  \n"
      f"{'Smoke settings (synthetic data, tiny sizes): not a measurement.  ' if args.smoke else ''}"
      + (f"MiniLM-L6 shape (6 layers, hidden 384, 12 heads, intermediate 1536, vocab "
         f"{args.vocab_size or 'CoLA words'}, exact GELU)" if args.shape == "minilm" else
         f"{args.shape} shape ({'RobertaFor' if args.shape == 'roberta-base' else 'DebertaV2For'}"
         f"SequenceClassification vs configs/glue.py:cola on a checkpoint of that family; 12 "
         f"layers, hidden 768, vocab {args.vocab_size or 'CoLA words'})")
      + f", random weights; L={args.seq_len}, "
      f"batch {args.batch}, fp32, dropout 0.1"
      + ("; transformers' batches cut to their longest example" if args.torch_padding == "longest"
         else "") + f"; steps {args.log_every + 1}-{args.steps} of each "
      f"run timed; {args.rounds} rounds, order rotating.\n\n"
      "| run | s/step (median) | s/step per round | examples/s (median) | transformers s/step / this (per round) | median | examples/s / KerasHub's (per round) |\n"
      "|---|---|---|---|---|---|---|\n"
      + "".join(f"| {r['impl']} | {r['s_per_step']:.3f} | {', '.join(f'{x:.3f}' for x in r['runs'])} | "
                f"{r['examples_per_s']:.1f} | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
                f"{r['ratio']:.2f}x | {', '.join(f'{x:.2f}' for x in r['vs_keras']) or 'n/a'} |\n"
                for r in rows))


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  if args.worker == "torch":
    return torch_worker(args)
  if args.smoke:
    args.rounds, args.steps, args.log_every, args.batch, args.seq_len = 1, 4, 2, 4, 16
    args.vocab_size = 0
  elif not os.path.isdir(args.cola_dir):
    print(f"CoLA not found at {args.cola_dir}: skipped (../shared/data is only on the project's machines).")
    return {}
  runs = _runs(args)
  load_start, t_start = harness.load_average(), time.time()
  rows = _rows(_run_rounds(args, runs), args.batch)
  table = _table(args, rows, load_start, t_start)
  harness.publish(__name__, table, record=not args.no_record)
  return {"rows": rows, "table": table}


if __name__ == "__main__":
  main()
