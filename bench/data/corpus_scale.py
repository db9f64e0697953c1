r"""Iterator start-up time, peak memory and throughput as the prepared corpus grows.

  python -m bench.data.corpus_scale [--other=/path/to/older/checkout] [--scales=1,4,16]

The Gutenberg books in ../shared/data (skips when absent) get a 30,522-entry WordPiece
vocabulary and are prepared once (16 shards) into --workdir; the corpus replicated N times
(each book N times, dealt round-robin to the shards as prepare deals documents, which is
what preparing the text replicated N times writes) is built from that for every N of
--scales. With --other (a checkout from before the memory-mapped arrays, e.g. a
`git worktree` of 7ad20ec), the same documents are also written in that format (TFRecord
files of tf.train.Example documents, as its prepare wrote them) and read by its loader.

Each measurement is a fresh child process pinned to one core: it imports the pipeline,
then times PretrainIterator(...) (construction) and its first batch (start-up = both),
then reads batches for --seconds (examples/s), L=128, P=20, batch 256. Peak RSS is the
child's ru_maxrss after those batches (the imports' baseline, about 0.9 GB with
TensorFlow, is in every row); RssAnon / RssFile split the final RSS into private memory
and mapped file pages (which the kernel may drop at any time). The loaders alternate for
--rounds rounds and each figure is the median. Results are printed and appended to bench/results/data.md unless
--no_record.
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from absl import flags

from bench import harness

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(harness.REPO)
GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
NUM_SHARDS = 16

_CHILD = r"""
import json, os, resource, sys, time
args = json.loads(sys.argv[1])
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
from input_pipeline import data_config, pretrain
cfg = data_config.default_data_config()
cfg.prepared_dir, cfg.vocab_path = args["prepared"], args["vocab"]
cfg.max_seq_length, cfg.max_predictions_per_seq = 128, 20
maxrss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
imported = maxrss()
t0 = time.perf_counter()
it = pretrain.PretrainIterator(cfg, batch_size=256, seed=0)
t1 = time.perf_counter()
next(it)
t2 = time.perf_counter()
count, start = 0, time.perf_counter()
while time.perf_counter() - start < args["seconds"]:
  count += len(next(it)["input_ids"])
rate = count / (time.perf_counter() - start)
status = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith("Rss"))
mb = lambda k: int(status[k].split()[0]) / 1024
print(json.dumps({"construct_s": t1 - t0, "startup_s": t2 - t0, "rate": rate,
                  "imported_mb": imported, "peak_mb": maxrss(),
                  "anon_mb": mb("RssAnon"), "file_mb": mb("RssFile")}))
it.close()
"""


def _flag_values() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_string("other", None, "A checkout from before the memory-mapped arrays: its "
                      "loader is measured on the same documents in its format.",
                      flag_values=fv)
  flags.DEFINE_string("other_label", "TFRecord loader (before)", "Its label.",
                      flag_values=fv)
  flags.DEFINE_list("scales", ["1", "4", "16"], "Replication factors.", flag_values=fv)
  flags.DEFINE_list("other_scales", None, "Factors at which --other's loader runs (default: "
                    "all); it holds the corpus in memory, 7 GB peak at 4x.", flag_values=fv)
  flags.DEFINE_float("seconds", 10.0, "Reading time per measurement.", flag_values=fv)
  flags.DEFINE_integer("rounds", 3, "Alternating rounds per corpus (medians reported).",
                       flag_values=fv)
  flags.DEFINE_string("workdir", os.path.join(tempfile.gettempdir(), "bert_jax_bench_scale"),
                      "Where the vocabulary and corpora are built (reused).", flag_values=fv)
  flags.DEFINE_boolean("record", True, "Append the table to bench/results/data.md.",
                       flag_values=fv)
  return fv


def replicate(base: str, out: str, times: int) -> dict:
  """The prepared corpus `base` with every document `times` times (corpus order: all of
  base, then all of it again, ...), dealt to NUM_SHARDS shards; its summary."""
  from input_pipeline import prepare  # pylint: disable=g-import-not-at-top
  from input_pipeline import store  # pylint: disable=g-import-not-at-top
  try:
    summary = prepare.load_summary(out)
    if summary.get("replicated") == times:
      return summary
  except FileNotFoundError:
    pass
  summary = prepare.load_summary(base)
  docs = _documents(base, summary)
  writer = store.ShardWriter(out, NUM_SHARDS, summary["vocab"]["vocab_size"])
  for g in range(times * len(docs)):
    tokens, lengths = docs[g % len(docs)]
    writer.add(g % NUM_SHARDS, tokens, lengths, [len(lengths)])
  shard_docs = writer.finish()
  summary = dict(summary, documents=summary["documents"] * times,
                 sentences=summary["sentences"] * times, tokens=summary["tokens"] * times,
                 input_bytes=summary["input_bytes"] * times, num_shards=NUM_SHARDS,
                 shard_documents=shard_docs, replicated=times)
  with open(os.path.join(out, prepare.SUMMARY_NAME), "w") as f:
    json.dump(summary, f, indent=2)
  return summary


def _documents(prepared: str, summary: dict) -> list:
  """[(tokens, sentence lengths)] of every document, in corpus order."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from input_pipeline import store  # pylint: disable=g-import-not-at-top
  arrays = store.open_arrays(prepared, summary)
  tokens, sent, doc = (arrays[k] for k in ("tokens", "sentence_starts", "document_starts"))
  by_g, position, shards = {}, 0, summary["num_shards"]
  for shard, count in enumerate(summary["shard_documents"]):
    for r in range(count):
      first, stop = int(doc[position]), int(doc[position + 1])
      by_g[r * shards + shard] = (np.array(tokens[sent[first]:sent[stop]]),
                                  np.diff(sent[first:stop + 1]))
      position += 1
  return [by_g[g] for g in range(len(by_g))]


def write_first_format(summary: dict, base: str, out: str, times: int) -> None:
  """The replicated corpus in the format before the arrays (TFRecord files of
  tf.train.Example documents, dealt round-robin, summary.json without format_version)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from input_pipeline import records  # pylint: disable=g-import-not-at-top
  done = os.path.join(out, "summary.json")
  if os.path.exists(done) and json.load(open(done)).get("replicated") == times:
    return
  os.makedirs(out, exist_ok=True)
  encoded = [records.encode_document(np.split(t, np.cumsum(l)[:-1]))
             for t, l in _documents(base, json.load(open(os.path.join(base, "summary.json"))))]
  names = [f"docs-{s:05d}-of-{NUM_SHARDS:05d}.tfrecord" for s in range(NUM_SHARDS)]
  writers = [tf.io.TFRecordWriter(os.path.join(out, n)) for n in names]
  for g in range(times * len(encoded)):
    writers[g % NUM_SHARDS].write(encoded[g % len(encoded)])
  for w in writers:
    w.close()
  old = {k: v for k, v in summary.items() if k not in ("format_version", "token_dtype")}
  with open(done, "w") as f:
    json.dump(dict(old, files=names), f, indent=2)


def measure(checkout: str, prepared: str, vocab: str, seconds: float) -> dict:
  return harness.run_child([sys.executable, "-c", _CHILD, json.dumps(
      {"prepared": prepared, "vocab": vocab, "seconds": seconds})], cwd=checkout,
                           env=harness.child_env(checkout), mark="")


def table(rows: list[dict]) -> str:
  lines = ["| loader | corpus | text | tokens | construct s | start-up s | peak RSS MB | "
           "RssAnon MB | RssFile MB | examples/s (1 core) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['loader']} | {r['scale']}x | {r['text_mb']:,.0f} MB | {r['tokens'] / 1e6:,.0f}M "
        f"| {r['construct_s']:.2f} | {r['startup_s']:.2f} | {r['peak_mb']:,.0f} | "
        f"{r['anon_mb']:,.0f} | {r['file_mb']:,.0f} | {r['rate']:,.0f} |")
  return "\n".join(lines)


def main(argv: list[str]) -> list[dict]:
  from bench.peers import input_pipeline as bench_input  # pylint: disable=g-import-not-at-top
  from common import errors  # pylint: disable=g-import-not-at-top
  fv = _flag_values()
  errors.parse_flags(fv, argv, __doc__)
  books = sorted(glob.glob(str(GUTENBERG / "pg*.txt")))
  if not books:
    print(f"bench.data.corpus_scale: skipped: no Gutenberg books in {GUTENBERG}.")
    return []
  start = time.time()
  base = bench_input.build_corpus(f"{GUTENBERG}/pg*.txt", os.path.join(fv.workdir, "base"),
                                  30522, vocab_chars=30_000_000)
  print(f"Base corpus: {base['summary']['documents']:,} books, "
        f"{base['summary']['tokens']:,} tokens ({time.time() - start:.0f} s, reused when "
        "built before).", flush=True)
  rows = []
  for scale in map(int, fv.scales):
    new_dir = os.path.join(fv.workdir, f"x{scale}")
    summary = replicate(base["prepared"], new_dir, scale)
    loaders = [("memory-mapped arrays", str(REPO), new_dir)]
    if fv.other and str(scale) in (fv.other_scales or fv.scales):
      old_dir = os.path.join(fv.workdir, f"x{scale}_tfrecord")
      write_first_format(summary, new_dir, old_dir, scale)
      loaders.append((fv.other_label, fv.other, old_dir))
    runs = {label: [] for label, _, _ in loaders}
    for _ in range(fv.rounds):  # Alternating: a noisy spell hits both loaders alike.
      for label, checkout, prepared in loaders:
        runs[label].append(measure(checkout, prepared, base["vocab"], fv.seconds))
        print(f"  {label} {scale}x: {json.dumps(runs[label][-1])}", flush=True)
    for label, results in runs.items():
      median = {k: statistics.median(r[k] for r in results) for k in results[0]}
      rows.append(dict(median, loader=label, scale=scale, tokens=summary["tokens"],
                       text_mb=summary["input_bytes"] / 1e6))
      print(table(rows[-1:]).splitlines()[-1], flush=True)
  result = table(rows)
  print(result)
  if fv.record:
    bench_input.append_results(
        f"### Corpus scale, {datetime.date.today().isoformat()}: "
        f"`{' '.join(['python -m bench.data.corpus_scale', *argv[1:]])}`\n\n"
        f"Machine: {bench_input.machine()}. Gutenberg ({len(books)} books), 30,522-entry "
        f"WordPiece, replicated; {NUM_SHARDS} shards; L=128, P=20, batch 256; one fresh "
        f"process per row, pinned to one core; {fv.seconds:g} s of batches.\n\n{result}")
  return rows


if __name__ == "__main__":
  main(sys.argv)
