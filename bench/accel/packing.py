"""Sequence packing: useful (non-padding) tokens/s, packed vs unpacked, same process.

    python -m bench.accel.packing                   # BERT-mini, L=512, 8 rows a step, built-in corpus
    python -m bench.accel.packing --preset=small --rows=8 --steps=20
    python -m bench.accel.packing --smoke           # seconds; what CI runs

Both runs train from the real input pipeline (`PretrainIterator` over the built-in
corpus, prepared once into --data_dir, with its own WordPiece vocabulary) with the
trainer's `train_step` (AdamW, dropout 0.1, fp32), the same rows per step (--rows)
and the same model; only `data.packing` differs. The time of a step includes fetching
its batch from the pipeline (which runs in its background thread, as in training).
Rounds alternate unpacked and packed (--rounds x --steps steps each, after a
compile + warm-up step), so machine noise hits both alike; rates are the mean work
per step over the median step time (the total-time rate is shown too). Useful tokens are the
real tokens of the batch (input_mask), examples are NSP examples. The ceiling is
the packed rows' token fill over the unpacked rows' fill (what packing can give at
equal step time). Appends to bench/results/accel.md unless --no_record (or --smoke).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench import harness

DEFAULT_DATA = "/tmp/bert_jax_packing_data"


class Run:
  """One mode's model, jitted step and iterator, stepped on demand."""

  def __init__(self, *, packing: bool, prepared: str, vocab: int, args):
    import jax
    from bert_jax import registry, trainer as trainer_lib
    from bert_jax.configs import default
    from input_pipeline import pretrain
    config = default.get_config()
    config.model.preset, config.model.vocab_size, config.model.dtype = args.preset, vocab, "float32"
    config.data.prepared_dir = prepared
    config.data.max_seq_length, config.data.max_predictions_per_seq = args.seq_len, args.preds
    config.data.packing, config.data.max_examples_per_row = packing, args.examples_per_row
    config.global_batch_size = args.rows
    config.mesh_shape.data = 1
    self.packing = packing
    model, objective, sample = registry.pretraining(config)
    self.trainer = trainer_lib.build(config, model, objective, sample, workdir=None,
                                     devices=jax.devices()[:1])
    self.mesh, self.rules = self.trainer.mesh, self.trainer.rules
    self.batch_sh, self.step_fn = self.trainer.batch_sharding, self.trainer.train_step
    with self.trainer.activate():
      self.state = self.trainer.init()
    self.rng = jax.random.key(0)
    self.iter = pretrain.PretrainIterator(config.data, batch_size=args.rows, seed=0)
    self.times, self.tokens, self.examples, self.fill = [], 0, 0, []
    t = time.perf_counter()
    self.steps(1, record=False)  # compile + warm-up
    self.compile_s = time.perf_counter() - t

  def steps(self, n: int, record: bool = True) -> None:
    import jax
    with self.trainer.activate():
      for _ in range(n):
        t = time.perf_counter()
        batch = next(self.iter)
        self.state, m = self.step_fn(self.state, self.trainer.to_global(batch), self.rng)
        jax.block_until_ready(m)
        if record:
          self.times.append(time.perf_counter() - t)
          self.tokens += int(batch["input_mask"].sum())
          w = batch.get("example_weights")
          self.examples += int(w.sum()) if w is not None else len(batch["input_ids"])
          self.fill.append(float(batch["input_mask"].mean()))

  def result(self) -> dict:
    total, n = sum(self.times), len(self.times)
    median = statistics.median(self.times)
    # Per-step work over the median step time: robust to the odd slow step of a shared
    # machine; the total-time rate is reported beside it.
    return dict(mode="packed" if self.packing else "unpacked", steps=n,
                step_ms=1e3 * median, compile_s=self.compile_s,
                examples_per_step=self.examples / n, fill=float(np.mean(self.fill)),
                useful_tokens_per_s=self.tokens / n / median,
                useful_tokens_per_s_total=self.tokens / total,
                examples_per_s=self.examples / n / median)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="mini")
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument("--preds", type=int, default=76)
  parser.add_argument("--rows", type=int, default=8, help="rows (sequences) per step")
  parser.add_argument("--examples_per_row", type=int, default=8)
  parser.add_argument("--steps", type=int, default=10, help="measured steps per round")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--corpus", default="default")
  parser.add_argument("--vocab_size", type=int, default=8192)
  parser.add_argument("--data_dir", default=DEFAULT_DATA)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--no_record", action="store_true")
  args = parser.parse_args(argv)
  if args.smoke:
    args.preset, args.seq_len, args.preds, args.rows, args.examples_per_row = "tiny", 64, 10, 4, 4
    args.steps, args.rounds, args.corpus = 2, 1, "tagged:24"
  from bench.accel import precision
  prepared = precision.build_data(args.data_dir, corpus=args.corpus, vocab_size=args.vocab_size)
  from input_pipeline import prepare
  vocab = int(prepare.load_summary(prepared)["vocab"]["vocab_size"])
  runs = [Run(packing=p, prepared=prepared, vocab=vocab, args=args) for p in (False, True)]
  for _ in range(args.rounds):
    for r in runs:
      r.steps(args.steps)
  rows = [r.result() for r in runs]
  for r in runs:
    r.iter.close()
  base = rows[0]["useful_tokens_per_s"]
  for r in rows:
    r["ratio"] = r["useful_tokens_per_s"] / base
  ceiling = rows[1]["fill"] / rows[0]["fill"]
  setup = (f"BERT-{args.preset}, L={args.seq_len}, P={args.preds} per example (packed rows: "
           f"P+E={args.preds + args.examples_per_row}), {args.rows} rows/step, up to "
           f"{args.examples_per_row} examples/row, fp32, dropout 0.1, corpus {args.corpus!r}; "
           f"{args.rounds} alternating rounds x {args.steps} steps")
  lines = [f"Setup: {setup}.", "",
           "| mode | examples/step | token fill | step ms (median) | useful tokens/s | examples/s | vs unpacked | useful tokens/s (total time) | compile s |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['mode']} | {r['examples_per_step']:.1f} | {r['fill']:.3f} | {r['step_ms']:.0f} | "
                 f"{r['useful_tokens_per_s']:,.0f} | {r['examples_per_s']:.1f} | {r['ratio']:.2f}x | "
                 f"{r['useful_tokens_per_s_total']:,.0f} | {r['compile_s']:.1f} |")
  lines.append("")
  lines.append(f"Ceiling at equal step time (packed fill / unpacked fill): {ceiling:.2f}x.")
  text = "\n".join(lines)
  print(text)
  if not (args.smoke or args.no_record):
    import jax
    harness.record(__name__, "Sequence packing", text,
                   command=harness.command("bench.accel.packing", argv),
                   machine=f"{harness.machine()}, load average {harness.load_average()}, jax "
                           f"{jax.__version__}, {jax.devices()[0].device_kind}.")
  return rows


if __name__ == "__main__":
  main()
