"""bfloat16 vs float32 compute (or, with --fp8, FP8 matmuls vs bfloat16): loss curves of a
short real pre-training run.

    python -m bench.accel.precision                 # BERT-mini, L=128, batch 16, 200 steps, built-in corpus
    python -m bench.accel.precision --fp8           # the same, bf16 + model.matmul_dtype=fp8 vs bf16
    python -m bench.accel.precision --corpus=tagged:64   # the same on a made-up corpus learnt fast
    python -m bench.accel.precision --smoke         # seconds; BERT-tiny on a tiny tagged corpus

Both runs use the trainer's pieces (`trainer.build`: sharded init, jitted train step,
`optim.make_optimizer`), the same seed (init and dropout) and the *same* batches:
the batches are read once from the real input pipeline (`PretrainIterator` over a
prepared corpus: the built-in corpus, with a WordPiece vocabulary trained on it,
built once into --data_dir) and fed to both runs. Only `config.model.dtype`
differs; master weights and optimizer state are float32 in both.

Reports the two curves (mean loss over each --log_every window), the max and mean
relative difference |bf16 - fp32| / fp32 of the per-step loss over the last 50
steps, and checks the tolerance: the final loss (mean of the last 10 steps)
within --tolerance (2%) relative. Exits 1 when the check fails (not in --smoke).
Appends to bench/results/accel.md unless --no_record (or --smoke).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from bench import harness

DEFAULT_DATA = "/tmp/bert_jax_precision_data"


def build_data(data_dir: str, *, corpus: str, vocab_size: int) -> str:
  """A prepared corpus in data_dir (built once); returns the prepared dir.

  corpus "tagged:N" is input_pipeline.testing's made-up corpus of N documents, each
  with its own 30 words: no vocabulary training (seconds), and learnable fast, since
  a token's context says which document, hence which words, it comes from.
  """
  from input_pipeline import prepare, vocab
  prepared = os.path.join(data_dir, "prepared")
  if os.path.exists(os.path.join(prepared, prepare.SUMMARY_NAME)):
    return prepared
  if corpus.startswith("tagged:"):
    from input_pipeline import testing
    return testing.make_tagged_corpus(data_dir, num_docs=int(corpus.split(":")[1]),
                                      words_per_doc=30)["prepared"]
  vocab_path = vocab.train_vocab(corpus, os.path.join(data_dir, "vocab"), vocab_size=vocab_size)
  prepare.prepare_corpus(corpus, vocab_path, prepared, num_shards=4, progress=False)
  return prepared


def read_batches(prepared: str, *, seq_len: int, preds: int, batch: int, steps: int,
                 seed: int) -> tuple[list[dict], int]:
  from input_pipeline import data_config, prepare, pretrain
  data_cfg = data_config.default_data_config()
  data_cfg.prepared_dir = prepared
  data_cfg.max_seq_length, data_cfg.max_predictions_per_seq = seq_len, preds
  it = pretrain.PretrainIterator(data_cfg, batch_size=batch, seed=seed)
  batches = [next(it) for _ in range(steps)]
  it.close()
  return batches, int(prepare.load_summary(prepared)["vocab"]["vocab_size"])


def run(dtype: str, batches: list[dict], *, preset: str, seq_len: int, preds: int, vocab: int,
        lr: float, warmup: int, seed: int, matmul_dtype: str | None = None) -> list[float]:
  """Per-step training loss of one run in `dtype` compute (float32 master weights), the
  encoder layers' matmuls in `matmul_dtype` (None: `dtype`)."""
  import jax
  from bert_jax import registry, trainer as trainer_lib
  from bert_jax.configs import default
  config = default.get_config()
  config.seed = seed
  config.model.preset, config.model.vocab_size, config.model.dtype = preset, vocab, dtype
  config.model.param_dtype = "float32"
  config.model.matmul_dtype = matmul_dtype
  config.data.max_seq_length, config.data.max_predictions_per_seq = seq_len, preds
  config.global_batch_size = len(batches[0]["input_ids"])
  config.opt.learning_rate = lr
  config.schedule.warmup_steps = warmup
  config.schedule.decay_steps = len(batches)
  config.mesh_shape.data = 1
  model, objective, sample = registry.pretraining(config)
  trainer = trainer_lib.build(config, model, objective, sample, workdir=None,
                              devices=jax.devices()[:1])
  losses = []
  with trainer.activate():
    state = trainer.init()
    rng = trainer.train_rng
    pending = []
    for b in batches:
      state, m = trainer.train_step(state, trainer.to_global(b), rng)
      pending.append(m["loss"])
    losses = [float(x) for x in jax.device_get(pending)]
  return losses


def compare(fp32: list[float], bf16: list[float], last: int = 50, final: int = 10) -> dict:
  a, b = np.asarray(fp32), np.asarray(bf16)
  rel = np.abs(b[-last:] - a[-last:]) / np.abs(a[-last:])
  fa, fb = a[-final:].mean(), b[-final:].mean()
  return dict(max_rel=float(rel.max()), mean_rel=float(rel.mean()), final_fp32=float(fa),
              final_bf16=float(fb), final_rel=float(abs(fb - fa) / abs(fa)), last=min(last, len(a)),
              final=min(final, len(a)))


def _parser():
  parser = harness.parser(__doc__)
  parser.add_argument("--preset", default="mini")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--preds", type=int, default=20)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--warmup", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--log_every", type=int, default=10)
  parser.add_argument("--tolerance", type=float, default=0.02, help="final loss, relative")
  parser.add_argument("--corpus", default="default",
                      help="corpus spec (default = built-in), or tagged:N (see build_data)")
  parser.add_argument("--vocab_size", type=int, default=8000, help="WordPiece entries to train")
  parser.add_argument("--data_dir", default=DEFAULT_DATA, help="vocab + prepared corpus cache")
  parser.add_argument("--fp8", action="store_true",
                      help="bf16 with FP8 matmuls (model.matmul_dtype=fp8) against bf16")
  return parser


def _report(args, pair, curves: dict, res: dict, ok: bool) -> tuple[str, str]:
  """The table of windowed losses and the verdict."""
  (r, _, _), (c, _, _) = pair
  ref, cand = curves[r], curves[c]
  k = args.log_every
  lines = [f"| steps | {r} loss | {c} loss | rel. diff |", "|---|---|---|---|"]
  for s in range(0, len(ref), k):
    a, b = float(np.mean(ref[s:s + k])), float(np.mean(cand[s:s + k]))
    lines.append(f"| {s + 1}-{min(s + k, len(ref))} | {a:.4f} | {b:.4f} | {100 * abs(b - a) / a:.2f}% |")
  summary = (f"Over the last {res['last']} steps, per-step |{c} - {r}| / {r}: max "
             f"{100 * res['max_rel']:.2f}%, mean {100 * res['mean_rel']:.2f}%. Final loss (mean of "
             f"the last {res['final']} steps): {r} {res['final_fp32']:.4f}, {c} "
             f"{res['final_bf16']:.4f}, {100 * res['final_rel']:.2f}% apart; tolerance "
             f"{100 * args.tolerance:.0f}%: {'PASS' if ok else 'FAIL'}.")
  return "\n".join(lines), summary


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  if args.smoke:
    args.preset, args.seq_len, args.preds, args.batch, args.steps = "tiny", 32, 5, 4, 20
    args.log_every, args.warmup, args.corpus = 5, 2, "tagged:16"
  if args.data_dir == DEFAULT_DATA and args.corpus != "default":
    args.data_dir = f"{DEFAULT_DATA}_{args.corpus.replace(':', '')}"
  t = time.perf_counter()
  prepared = build_data(args.data_dir, corpus=args.corpus, vocab_size=args.vocab_size)
  batches, vocab = read_batches(prepared, seq_len=args.seq_len, preds=args.preds,
                                batch=args.batch, steps=args.steps, seed=args.seed)
  data_s = time.perf_counter() - t
  common = dict(preset=args.preset, seq_len=args.seq_len, preds=args.preds, vocab=vocab,
                lr=args.lr, warmup=args.warmup, seed=args.seed)
  # (label, compute dtype, matmul dtype): the reference run, then the one checked against it
  pair = ([("bf16", "bfloat16", None), ("fp8", "bfloat16", "fp8")] if args.fp8 else
          [("fp32", "float32", None), ("bf16", "bfloat16", None)])
  timing, curves = {}, {}
  for label, dtype, matmul_dtype in pair:
    t = time.perf_counter()
    curves[label] = run(dtype, batches, matmul_dtype=matmul_dtype, **common)
    timing[label] = time.perf_counter() - t
  (r, _, _), (c, _, _) = pair
  res = compare(curves[r], curves[c])  # the reference, the candidate
  ok = res["final_rel"] <= args.tolerance and np.all(np.isfinite(curves[c]))
  table, summary = _report(args, pair, curves, res, ok)
  setup = (f"BERT-{args.preset}, vocab {vocab}, L={args.seq_len}, P={args.preds}, batch "
           f"{args.batch}, {args.steps} steps, AdamW lr {args.lr} (warmup {args.warmup}, linear "
           f"decay to 0 at step {args.steps}), seed {args.seed}, dropout 0.1; corpus "
           f"{args.corpus!r}, prepared in "
           f"{args.data_dir}; data read once ({data_s:.0f} s) and fed to both runs; run time {r} "
           f"{timing[r]:.0f} s, {c} {timing[c]:.0f} s"
           + ("; fp8 = model.matmul_dtype=fp8 over bf16 compute" if args.fp8 else ""))
  print(setup)
  print(table)
  print(summary)
  if harness.recording(args):
    import jax
    harness.record(__name__, f"{c} vs {r} loss curves", f"{table}\n\n{summary}",
                   command=harness.command("bench.accel.precision", argv),
                   machine=f"{harness.machine()}, jax {jax.__version__} (CPU). {setup}. Loss = "
                           f"MLM + NSP, mean over each {args.log_every}-step window.")
  if not ok and not args.smoke:
    sys.exit(1)
  return dict(res, ok=bool(ok), **curves)


if __name__ == "__main__":
  main()
