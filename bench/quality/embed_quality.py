"""Does contrastive fine-tuning (config.task=embed) make a small encoder a better retriever?
Retrieval scores on a held-out BEIR-layout set built from real text, before and after, with
several seeds.

    python -m bench.quality.embed_quality [--workdir=/tmp/bench_embed_quality] [--seeds=2] [--no_record]
    python -m bench.quality.embed_quality --smoke --no_record     # seconds: the test

The encoder: the README's main job (configs/tiny_pretrain.py: 2 layers, hidden 128, on the
built-in corpus; bench runs it first unless --init_checkpoint is given). The data: Project
Gutenberg books (../shared/data/gutenberg; skipped when absent): each paragraph of 3+
sentences becomes (its first sentence, the rest). Training pairs come from the books of
one half of MANIFEST.tsv's order, the BEIR-layout set (queries: first sentences; corpus:
the rests; qrels: each query's own rest) from the other half, so no book is in both. Each
encoder is also scored on GLUE's STS-B dev file (--sts_file; cosine Spearman x100, as
sentence-transformers' EmbeddingSimilarityEvaluator) where it is present.
Appends the table to bench/results/quality.md unless --no_record.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

from bench import harness

REPO = pathlib.Path(harness.REPO)
GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
STSB_DEV = REPO.parent / "shared" / "data" / "glue" / "STS-B" / "dev.tsv"
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'])")


def paragraph_pairs(path: pathlib.Path, limit: int) -> list[tuple[str, str]]:
  """(first sentence, the rest) of each paragraph of 3 to 8 sentences and 30-150 words."""
  text = path.read_text(encoding="utf-8", errors="replace")
  out = []
  for block in re.split(r"\n\s*\n", text):
    para = " ".join(block.split())
    sentences = _SENTENCE.split(para)
    if 3 <= len(sentences) <= 8 and 30 <= len(para.split()) <= 150:
      out.append((sentences[0], " ".join(sentences[1:])))
      if len(out) >= limit:
        break
  return out


def write_data(root: pathlib.Path, books: list[pathlib.Path], per_book: int, queries: int) -> None:
  """root/train.jsonl (pairs of the first half of `books`), root/dev.jsonl and root/beir/
  (the second half)."""
  half = len(books) // 2
  train = [p for b in books[:half] for p in paragraph_pairs(b, per_book)]
  held = [p for b in books[half:] for p in paragraph_pairs(b, per_book)]
  root.mkdir(parents=True, exist_ok=True)
  write = lambda name, rows: (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  write("train.jsonl", [{"anchor": a, "positive": p} for a, p in train])
  write("dev.jsonl", [{"anchor": a, "positive": p} for a, p in held[queries:queries + 256]])
  (root / "beir" / "qrels").mkdir(parents=True, exist_ok=True)
  write("beir/queries.jsonl", [{"_id": f"q{i}", "text": a} for i, (a, _) in enumerate(held[:queries])])
  write("beir/corpus.jsonl", [{"_id": f"d{i}", "title": "", "text": p} for i, (_, p) in enumerate(held)])
  (root / "beir" / "qrels" / "test.tsv").write_text(
      "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(queries)))
  print(f"bench.quality.embed_quality: {len(train)} training pairs ({half} books), {queries} queries "
        f"over {len(held)} documents ({len(books) - half} other books)", flush=True)


def _python(args: list[str], log: pathlib.Path) -> str:
  with log.open("w") as f:
    proc = subprocess.run([sys.executable] + args, cwd=REPO, stdout=subprocess.PIPE, stderr=f,
                          text=True, check=False)
  if proc.returncode:
    raise SystemExit(f"bench.quality.embed_quality: {' '.join(args[:3])} failed; see {log}")
  return proc.stdout


def scores(checkpoint: str, beir: pathlib.Path, work: pathlib.Path, name: str,
           sts_file: str = "") -> dict:
  """The retrieval scores, and STS-B's cosine Spearman ("sts_spearman") with `sts_file`."""
  sts = [f"--sts_file={sts_file}"] if sts_file else []
  out = _python(["-m", "bert_jax.embed_eval", f"--checkpoint={checkpoint}",
                 f"--beir_dir={beir}", "--max_seq_length=64"] + sts, work / f"{name}_eval.log")
  result = json.loads(out.strip().splitlines()[-1])
  return {**result["retrieval"], **({"sts_spearman": result["sts"]["spearman"]} if sts else {})}


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", default="/tmp/bench_embed_quality")
  ap.add_argument("--init_checkpoint", default="", help="default: the README's tiny model")
  ap.add_argument("--seeds", type=int, default=2)
  ap.add_argument("--per_book", type=int, default=100, help="paragraphs a book, at most")
  ap.add_argument("--queries", type=int, default=500)
  ap.add_argument("--epochs", type=int, default=2)
  ap.add_argument("--lr", type=float, default=1e-4)
  ap.add_argument("--sts_file", default=str(STSB_DEV) if STSB_DEV.exists() else "",
                  help="GLUE's STS-B dev.tsv (default: ../shared/data's, when present)")
  ap.add_argument("--smoke", action="store_true")
  ap.add_argument("--no_record", action="store_true")
  args = ap.parse_args(argv)
  books = sorted(GUTENBERG.glob("pg*.txt"))
  if not books:
    print(f"bench.quality.embed_quality: skipped: no Gutenberg books in {GUTENBERG}.")
    return
  work = pathlib.Path(args.workdir)
  books = books[:4] if args.smoke else books
  write_data(work / "data", books, 20 if args.smoke else args.per_book,
             16 if args.smoke else args.queries)
  init = args.init_checkpoint
  if not init:
    init = str(work / "pretrained")
    _python(["-m", "bert_jax.main", "--config=configs/tiny_pretrain.py", f"--workdir={init}"]
            + (["--config.num_train_steps=4"] if args.smoke else []), work / "pretrain.log")
  vocab = init + "/vocab" if not args.init_checkpoint else init
  rows = [("before (the encoder, mean pooling)", scores(init, work / "data" / "beir", work,
                                                         "before", args.sts_file), 0.0)]
  for seed in range(args.seeds):
    run, start = work / f"embed_seed{seed}", time.time()
    _python(["-m", "bert_jax.main", "--config=configs/embed.py", f"--workdir={run}",
             f"--config.init_checkpoint={init}", f"--config.vocab_path={vocab}",
             f"--config.train_file={work / 'data' / 'train.jsonl'}",
             f"--config.eval_file={work / 'data' / 'dev.jsonl'}", "--config.eval_anchor_column=",
             "--config.eval_positive_column=", "--config.max_seq_length=64",
             f"--config.seed={seed}", f"--config.num_epochs={1 if args.smoke else args.epochs}",
             f"--config.opt.learning_rate={args.lr}", "--config.global_batch_size=32"],
            work / f"embed_seed{seed}.log")
    rows.append((f"contrastive fine-tuning, seed {seed}", scores(str(run), work / "data" / "beir",
                                                                 work, f"seed{seed}", args.sts_file),
                 time.time() - start))
  sts = " STS-B dev Spearman |" if args.sts_file else ""
  table = [f"| encoder | nDCG@10 | Recall@100 | MRR@10 |{sts} fine-tuning s |",
           "|---|---|---|---|" + ("---|" if sts else "") + "---|"]
  table += [f"| {n} | {s['ndcg@10']:.1f} | {s['recall@100']:.1f} | {s['mrr@10']:.1f} |"
            + (f" {s['sts_spearman']:.2f} |" if sts else "") + f" {t:.0f} |" for n, s, t in rows]
  print("\n".join(table))
  if not args.no_record:
    harness.record(__name__, "Contrastive fine-tuning and retrieval, tiny scale (issue 38)",
                   __doc__.split(chr(10))[0] + "\n\n" + "\n".join(table),
                   command=harness.command("bench.quality.embed_quality", argv or None))


if __name__ == "__main__":
  main()
