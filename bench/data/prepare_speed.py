r"""Speed of `python -m input_pipeline.prepare`, stage by stage, against the code at a revision.

  python -m bench.data.prepare_speed [--input=GLOBS] [--max_mb=N] [--vocab=DIR]
      [--ref_rev=HEAD] [--rounds=3] [--record]

The corpus is the Project Gutenberg books in ../shared/data/gutenberg (skipped with a
message when absent) or --input (comma-separated globs), whole files in sorted order up to
--max_mb megabytes. The WordPiece vocabulary (30,522 entries, uncased) is trained once into
a temporary directory with `input_pipeline.vocab`, unless --vocab names one.

Each measurement runs in a fresh child process that imports `input_pipeline` from one code
tree: this checkout's working tree ("new") or, with --ref_rev, the `input_pipeline` package
of that revision unpacked by `git archive` into a temporary directory ("ref"). The trees
alternate, round after round, so both see the same machine state. In a child:

  read       corpus.iter_documents over the whole corpus (text.py: reading, decoding,
             Gutenberg markers, lines / paragraphs into documents), kept in memory;
  split      sentences.document_sentences,           \  inside prepare.tokenize_documents
  tokenize   the tokenizer's encode call,             |  on the same ~1 MB tasks a worker
  flatten    the rest of tokenize_documents (arrays)  /  gets (prepare._tasks), in order;
  write      prepare.deal_documents into a store.ShardWriter (16 shards) and its finish();

then, in two more children, the end-to-end `prepare_corpus` wall time with num_workers=1
and 2 (spawning the pool included). Figures are MB of input text per second (MB = 10^6
bytes of the files), the median over rounds; "per core" divides by the processes that
compute (1 for num_workers=1, min(workers, cores) otherwise). The prepared arrays of the
two trees are compared byte for byte (sha256). The result is printed as a markdown section;
--record appends it to the results file.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile

from bench import harness

REPO = pathlib.Path(harness.REPO)
GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
STAGES = ("read", "split", "tokenize", "flatten", "write")

# Runs in the child, with the code tree first on sys.path. Prints one JSON line.
_CHILD = r"""
import hashlib, json, os, sys, tempfile, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["tree"])
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from input_pipeline import corpus, prepare, sentences, store, tokenizer
assert os.path.dirname(prepare.__file__) == os.path.join(args["tree"], "input_pipeline"), prepare.__file__
out = {}
def digest(d):
  return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
          for n in store.FILES}
if args["mode"] == "stages":
  stats = corpus.new_stats()
  t = time.perf_counter()
  docs = list(corpus.iter_documents(args["spec"], stats=stats))
  out["read"] = time.perf_counter() - t
  tok = tokenizer.Tokenizer.from_path(args["vocab"])
  clock = {"split": 0.0, "tokenize": 0.0}
  depth = [0]
  def timed(fn, key):
    def wrapper(*a, **k):
      depth[0] += 1
      t = time.perf_counter()
      try:
        return fn(*a, **k)
      finally:
        depth[0] -= 1
        if depth[0] == 0:
          clock[key] += time.perf_counter() - t
    return wrapper
  sentences.document_sentences = timed(sentences.document_sentences, "split")
  for name in ("encode_flat", "encode_batch"):
    if hasattr(tok, name):
      setattr(tok, name, timed(getattr(tok, name), "tokenize"))
  whole, write, first = 0.0, 0.0, 0
  with tempfile.TemporaryDirectory() as d:
    writer = store.ShardWriter(d, 16, tok.vocab_size)
    for task in prepare._tasks(docs):
      t = time.perf_counter()
      result = prepare.tokenize_documents(task, tok)
      t1 = time.perf_counter()
      prepare.deal_documents(writer, result, first)
      write += time.perf_counter() - t1
      whole += t1 - t
      first += len(result["document_sentences"])
    t = time.perf_counter()
    writer.finish()
    write += time.perf_counter() - t
  out.update(split=clock["split"], tokenize=clock["tokenize"],
             flatten=whole - clock["split"] - clock["tokenize"], write=write,
             bytes=stats["bytes"], documents=first)
else:
  d = args["output_dir"]
  t = time.perf_counter()
  summary = prepare.prepare_corpus(args["spec"], args["vocab"], d,
                                   num_workers=args["workers"], progress=False)
  out.update(wall=time.perf_counter() - t, bytes=summary["input_bytes"],
             tokens=summary["tokens"], sha256=digest(d))
print("RESULT " + json.dumps(out))
"""


def select_files(patterns: str, max_mb: float | None) -> list[str]:
  """Files of the comma-separated globs, sorted; whole files up to max_mb (at least one)."""
  files = sorted({f for p in patterns.split(",") if p.strip()
                  for f in glob.glob(p.strip()) if os.path.isfile(f)})
  if max_mb is None:
    return files
  chosen, total = [], 0
  for f in files:
    size = os.path.getsize(f)
    if chosen and total + size > max_mb * 1e6:
      break
    chosen.append(f)
    total += size
  return chosen


def ref_tree(rev: str, root: str) -> str:
  """`input_pipeline` of git revision `rev`, unpacked under root; returns the tree's path."""
  sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO,
                       capture_output=True, text=True, check=True).stdout.strip()
  tree = os.path.join(root, f"ref_{sha[:12]}")
  if not os.path.isdir(os.path.join(tree, "input_pipeline")):
    os.makedirs(tree, exist_ok=True)
    archive = subprocess.run(["git", "archive", sha, "input_pipeline"], cwd=REPO,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
  return tree


def run_child(args: dict) -> dict:
  return harness.run_child([sys.executable, "-c", _CHILD, json.dumps(args)], cwd=args["tree"],
                           env=harness.child_env(args["tree"]))


def measure(trees: dict[str, str], spec: str, vocab: str, rounds: int, workdir: str,
            workers=(1, 2)) -> dict:
  """{tree name: {"stages": [per round], "e2e": {workers: [per round]}}}, alternating."""
  res = {name: {"stages": [], "e2e": {w: [] for w in workers}} for name in trees}
  for r in range(rounds):
    for name, tree in trees.items():
      res[name]["stages"].append(run_child(dict(mode="stages", tree=tree, spec=spec,
                                                vocab=vocab)))
      print(f"round {r + 1}/{rounds} {name}: stages done", file=sys.stderr, flush=True)
    for w in workers:
      for name, tree in trees.items():
        out = os.path.join(workdir, f"out_{name}_{w}")
        res[name]["e2e"][w].append(run_child(dict(mode="e2e", tree=tree, spec=spec,
                                                  vocab=vocab, workers=w, output_dir=out)))
        print(f"round {r + 1}/{rounds} {name}: {w} workers "
              f"{res[name]['e2e'][w][-1]['wall']:.1f}s", file=sys.stderr, flush=True)
  return res


def _rate(mb: float, seconds: list[float]) -> float:
  return mb / statistics.median(seconds)


def report(res: dict, command: str, files: list[str], rounds: int) -> str:
  """The markdown section."""
  names = list(res)
  mb = res[names[0]]["stages"][0]["bytes"] / 1e6
  cores = os.cpu_count() or 1
  machine = (f"{harness.machine()}. Corpus: {len(files)} files, {mb:.1f} MB; median of "
             f"{rounds} alternating rounds; MB/s of input text (one process for the stages).")
  lines = []
  head = "| stage | " + " | ".join(f"{n} MB/s" for n in names)
  head += " | speed-up |" if len(names) == 2 else " |"
  lines += [head, "|" + "---|" * (len(names) + 1 + (len(names) == 2))]
  rates = {}
  for stage in STAGES:
    rates[stage] = [_rate(mb, [s[stage] for s in res[n]["stages"]]) for n in names]
  rates["all stages"] = [
      _rate(mb, [sum(s[k] for k in STAGES) for s in res[n]["stages"]]) for n in names]
  for stage, values in rates.items():
    row = f"| {stage} | " + " | ".join(f"{v:.1f}" for v in values)
    row += f" | {values[1] / values[0]:.2f}x |" if len(values) == 2 else " |"
    lines.append(row)
  lines += ["", "| prepare_corpus | " + " | ".join(
      f"{n} s | {n} MB/s | {n} MB/s per core" for n in names) + (
          " | speed-up |" if len(names) == 2 else " |"),
            "|" + "---|" * (1 + 3 * len(names) + (len(names) == 2))]
  for w in res[names[0]]["e2e"]:
    per_core = min(w, cores)
    walls = [statistics.median(r["wall"] for r in res[n]["e2e"][w]) for n in names]
    row = f"| num_workers={w} | " + " | ".join(
        f"{t:.2f} | {mb / t:.1f} | {mb / t / per_core:.1f}" for t in walls)
    row += f" | {walls[0] / walls[1]:.2f}x |" if len(names) == 2 else " |"
    lines.append(row)
  if len(names) == 2:
    same = all(r["sha256"] == q["sha256"] for w in res[names[0]]["e2e"]
               for r, q in zip(res[names[0]]["e2e"][w], res[names[1]]["e2e"][w]))
    lines += ["", f"Prepared arrays ({', '.join(('tokens.npy', 'sentence_starts.npy', 'document_starts.npy'))}) "
              f"of {names[0]} and {names[1]}, every run and worker count: "
              f"{'byte-identical' if same else 'DIFFERENT'}."]
  return harness.section("prepare speed", "\n".join(lines), command=command, machine=machine)


def main(argv: list[str] | None = None) -> dict | None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--input", default=None, help="comma-separated globs (default: the "
                      "Gutenberg books in ../shared/data/gutenberg)")
  parser.add_argument("--max_mb", type=float, default=None, help="at most this many MB "
                      "of whole files")
  parser.add_argument("--vocab", default=None, help="vocabulary (default: trained here)")
  parser.add_argument("--ref_rev", default=None, help="git revision to compare with")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--workdir", default=None, help="scratch (default: a temporary dir)")
  parser.add_argument("--record", action="store_true", help="append to the results file")
  args = parser.parse_args(argv)
  patterns = args.input or str(GUTENBERG / "*.txt")
  files = select_files(patterns, args.max_mb)
  if not files:
    print(f"prepare_speed: skipped: no files match {patterns!r} (the Gutenberg books are "
          f"expected in {GUTENBERG}; or pass --input).")
    return None
  spec = ",".join(files)
  with tempfile.TemporaryDirectory(prefix="prepare_speed_") as tmp:
    workdir = args.workdir or tmp
    os.makedirs(workdir, exist_ok=True)
    vocab = args.vocab
    if vocab is None:
      sys.path.insert(0, str(REPO))
      from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
      vocab = vocab_lib.train_vocab(spec, os.path.join(workdir, "vocab"), vocab_size=30522,
                                    max_chars=20_000_000)
    trees = {}
    if args.ref_rev:
      trees[f"ref {args.ref_rev}"] = ref_tree(args.ref_rev, workdir)
    trees["new"] = str(REPO)
    res = measure(trees, spec, vocab, args.rounds, workdir)
  command = "python -m bench.data.prepare_speed " + " ".join(
      shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
  text = report(res, command.strip(), files, args.rounds)
  print(text)
  if args.record:
    harness.append(__name__, text)
  return res


if __name__ == "__main__":
  main()
