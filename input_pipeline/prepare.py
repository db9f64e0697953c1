r"""Tokenizes a corpus once into memory-mappable arrays of token ids.

  python -m input_pipeline.prepare --input='data/*.txt' --vocab=/tmp/vocab \
      --output_dir=/tmp/prepared [--num_shards=16 --num_workers=8]
  python -m input_pipeline.prepare --convert=OLD_DIR --output_dir=NEW_DIR

--input: file globs, "default" (built-in corpus) or "tfds:NAME" (see corpus.py). Files are
plain text (.txt, also .gz / .zst), JSON Lines (.jsonl / .json, also .gz / .zst), Parquet or
Arrow, and a HuggingFace `datasets` directory (save_to_disk) is read whole: each record's
--text_field is a document (sources.py); --max_bad_records skips a few records without
text (counted in the log and summary.json). The
output holds tokenized sentences per document (store.py: token ids, sentence and document
offsets, documents dealt round-robin to --num_shards shards, the unit a host reads), no
pairing or masking: one
prepared corpus serves every sequence length, epoch and seed. DIR/summary.json is written
last (its presence marks a complete run) with the counts and the options used, including
the vocabulary's sha256 so that a pipeline run with another vocabulary is refused.

Streaming and parallel: the main process reads documents and hands batches of about 1 MB
of text to `num_workers` processes, at most 2 per worker in flight, so memory does not
grow with the corpus (the largest single document must fit). Workers split sentences,
and batch-tokenize; the main process deals the documents round-robin to the shards' scratch
files, which are concatenated into the final arrays at the end.
Workers end with the main process, even when it is killed; SIGTERM stops the run with a
message (exit status 143), leaving the output incomplete (no summary.json).

Input bytes that are not valid UTF-8 are replaced by U+FFFD and counted (logged, and in
summary.json); a file with more than --max_replaced_fraction (default 1%) of them is
refused.

--convert turns a directory of the first format (TFRecord files of tf.train.Example
documents, before the arrays) into the arrays, copying the token ids.
"""
import collections
import contextlib
import datetime
import itertools
import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time

from absl import flags
from absl import logging

import numpy as np

from common import dirlock
from common import errors
from common import fileio
from input_pipeline import corpus
from input_pipeline import records
from input_pipeline import sentences as sentences_lib
from input_pipeline import store
from input_pipeline import text as text_lib
from input_pipeline import tokenizer as tokenizer_lib

SUMMARY_NAME = "summary.json"
_TASK_CHARS = 1 << 20

# ------------------------------------------------------------------------- workers

_worker_tokenizer = None


class EmptyCorpusError(errors.UserError, ValueError):
  """The input holds no text at all."""


def _init_worker(vocab_path: str, lowercase: bool | None) -> None:
  global _worker_tokenizer
  # Parallelism comes from the processes; Rust threads on top would oversubscribe.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _worker_tokenizer = tokenizer_lib.Tokenizer.from_path(vocab_path, lowercase)


def _init_pool_worker(vocab_path: str, lowercase: bool | None) -> None:
  _exit_with_parent()
  _init_worker(vocab_path, lowercase)


def _exit_with_parent() -> None:
  """Ends this pool worker as soon as the main process is gone, even killed by SIGKILL
  (no pool shutdown then reaches the workers, which would tokenize on for nothing)."""
  parent = multiprocessing.parent_process()

  def watch():
    parent.join()  # Returns when the parent's end of the spawn pipe closes.
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, name="exit_with_parent", daemon=True).start()


def tokenize_documents(docs: list[dict], tok: tokenizer_lib.Tokenizer | None = None) -> dict:
  """Raw documents -> their token ids as flat arrays, and counts; empty documents dropped.

  Returns {"tokens": [T] (the store's token dtype: small to send between processes),
  "sentence_lengths": [S] int64, "document_sentences": [D] int64 (the sentences of each
  kept document), "sentences", "tokens_count", "unk_tokens", "empty_documents"}. Sentences
  without tokens are dropped, then documents without sentences.
  """
  tok = tok or _worker_tokenizer
  per_doc = [sentences_lib.document_sentences(d) for d in docs]
  counts = np.fromiter(map(len, per_doc), np.int64, len(per_doc))
  tokens, lengths = tok.encode_flat(list(itertools.chain.from_iterable(per_doc)))
  tokens = tokens.astype(store.token_dtype(tok.vocab_size))
  kept = lengths > 0
  sentence_doc = np.repeat(np.arange(len(per_doc)), counts)
  doc_sentences = np.bincount(sentence_doc[kept], minlength=len(per_doc)).astype(np.int64)
  lengths = lengths[kept].astype(np.int64)
  return {"tokens": tokens, "sentence_lengths": lengths,
          "document_sentences": doc_sentences[doc_sentences > 0],
          "sentences": len(lengths), "tokens_count": len(tokens),
          "unk_tokens": int(np.count_nonzero(tokens == tok.unk_id)),
          "empty_documents": int(np.count_nonzero(doc_sentences == 0))}


# ------------------------------------------------------------------------- main process


def _tasks(docs):
  """Groups documents into tasks of about 1 MB of text."""
  task, chars = [], 0
  for doc in docs:
    task.append(doc)
    chars += sum(map(len, doc["texts"]))
    if chars >= _TASK_CHARS:
      yield task
      task, chars = [], 0
  if task:
    yield task


def _results(docs, vocab_path, lowercase, num_workers):
  """Tokenized task results in corpus order, in-process or from a worker pool.

  The main thread reads and submits; at most 2 tasks per worker are in flight, which
  bounds memory whatever the corpus size.
  """
  if num_workers <= 1:
    _init_worker(vocab_path, lowercase)
    for task in _tasks(docs):
      yield tokenize_documents(task)
    return
  # spawn, not fork: the parent may hold TensorFlow and tokenizers thread pools.
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(num_workers, initializer=_init_pool_worker,
                initargs=(vocab_path, lowercase)) as pool:
    pending = collections.deque()
    for task in _tasks(docs):
      pending.append(pool.apply_async(tokenize_documents, (task,)))
      if len(pending) >= 2 * num_workers:
        yield pending.popleft().get()
    while pending:
      yield pending.popleft().get()


class _Progress:
  """One status line on stderr, refreshed at most every `every` seconds."""

  def __init__(self, enabled: bool, every: float = 2.0):
    self.enabled, self.every = enabled, every
    self.start = self.last = time.time()

  def update(self, summary: dict, read_stats: dict, final: bool = False) -> None:
    now = time.time()
    if not self.enabled or (not final and now - self.last < self.every):
      return
    self.last = now
    elapsed = max(now - self.start, 1e-9)
    line = (f"[prepare] {summary['documents']:,} docs, {summary['sentences']:,} sentences, "
            f"{summary['tokens']:,} tokens, {read_stats['bytes'] / 1e6:,.1f} MB read "
            f"({read_stats['bytes'] / 1e6 / elapsed:.1f} MB/s), {elapsed:.0f}s")
    end = "\n" if final or not sys.stderr.isatty() else ""
    sys.stderr.write(("\r" if sys.stderr.isatty() else "") + line + end)
    sys.stderr.flush()


class _Terminated(BaseException):
  """SIGTERM arrived (a BaseException: no `except Exception` on the way swallows it)."""


class _StopOnSigterm:
  """While active (in the main thread only), SIGTERM raises _Terminated in the main
  thread, so that the run stops through its `finally` blocks (the worker pool is
  terminated, the shard writers closed) instead of vanishing with status -15."""

  def __enter__(self):
    self.previous = None
    if threading.current_thread() is threading.main_thread():
      self.previous = signal.signal(signal.SIGTERM, self._raise)
    return self

  @staticmethod
  def _raise(signum, frame):
    del signum, frame
    raise _Terminated()

  def __exit__(self, *exc):
    if self.previous is not None:
      signal.signal(signal.SIGTERM, self.previous)
    return False


def hold_output(output_dir: str):
  """The writer lock of a prepared directory (common/dirlock.py, local or gs://):
  a second writer (prepare, prepare_hosts' merge, a training job's build step) is refused
  with one line while the first lives."""
  return dirlock.hold(output_dir, dirlock.Owner(
      f"the prepared corpus {output_dir}", "Two writers of one prepared directory would "
      "overwrite each other's arrays.", "another --output_dir (a training job: another "
      "data.prepared_dir)"))


@contextlib.contextmanager
def _removed_if_left_empty(output_dir: str, made: bool):
  """A run refused (a bad input, an empty corpus) after it made `output_dir` leaves no empty
  directory behind; a directory the user made, or anything in it, is left as it is."""
  try:
    yield
  except errors.UserError:
    if made:  # its lock released: empty unless the run wrote something (then kept)
      with contextlib.suppress(OSError):
        fileio.path(output_dir).rmdir()
    raise


def prepare_corpus(input_spec: str, vocab_path: str, output_dir: str, *,
                   lowercase: bool | None = None, num_shards: int = 16,
                   num_workers: int | None = None, fmt: str = "auto",
                   text_field: str = "text", tfds_data_dir: str | None = None,
                   progress: bool = True,
                   max_replaced_fraction: float = text_lib.MAX_REPLACED_FRACTION,
                   max_bad_records: int = 0) -> dict:
  """Tokenizes `input_spec` into `output_dir` (see module doc); returns the summary.

  SIGTERM (while this runs in the main thread) ends the process with status 143 and a
  message saying that the output is incomplete.
  """
  if num_shards < 1:
    raise errors.ConfigError(f"--num_shards={num_shards}: a corpus needs at least 1 shard "
                             "(one a host of a multi-host job, 16 by default).")
  if max_bad_records < 0:
    raise errors.ConfigError(f"--max_bad_records={max_bad_records}: 0 (refuse any record "
                             "without usable text) or a positive count to skip.")
  fileio.check_output_dir(output_dir)
  made = not fileio.is_remote(output_dir) and not fileio.path(output_dir).exists()
  with _StopOnSigterm():
    try:
      with _removed_if_left_empty(output_dir, made), hold_output(output_dir):
        return _prepare(input_spec, vocab_path, output_dir, lowercase=lowercase,
                        num_shards=num_shards, num_workers=num_workers, fmt=fmt,
                        text_field=text_field, tfds_data_dir=tfds_data_dir,
                        progress=progress, max_replaced_fraction=max_replaced_fraction,
                        max_bad_records=max_bad_records)
    except _Terminated:
      print(f"prepare: stopped by SIGTERM: {output_dir} is incomplete (it has no "
            f"{SUMMARY_NAME}); run the same command again to prepare it.",
            file=sys.stderr, flush=True)
      raise SystemExit(128 + signal.SIGTERM)  # pylint: disable=raise-missing-from


def _prepare(input_spec: str, vocab_path: str, output_dir: str, *, lowercase: bool | None,
             num_shards: int, num_workers: int | None, fmt: str, text_field: str,
             tfds_data_dir: str | None, progress: bool, max_replaced_fraction: float,
             max_bad_records: int = 0) -> dict:
  num_workers = num_workers or os.cpu_count() or 1
  tok = tokenizer_lib.Tokenizer.from_path(vocab_path, lowercase)  # Fails early if bad.
  fileio.path(output_dir).mkdir(parents=True, exist_ok=True)
  summary_path = fileio.path(fileio.join(output_dir, SUMMARY_NAME))
  if summary_path.exists():
    summary_path.unlink()  # Incomplete until rewritten at the end.
  read_stats = corpus.new_stats()
  docs = corpus.iter_documents(input_spec, fmt=fmt, text_field=text_field,
                               tfds_data_dir=tfds_data_dir, stats=read_stats,
                               max_replaced_fraction=max_replaced_fraction,
                               max_bad_records=max_bad_records)
  first = next(docs, None)  # Bad globs and empty corpora fail here, before any work.
  if first is None:
    raise EmptyCorpusError(f"Corpus {input_spec!r} is empty: {read_stats['files']} files, "
                           f"{read_stats['bytes']} bytes, no text. Check --input (and "
                           "--text_field for record files).")
  start = time.time()
  writer = store.ShardWriter(output_dir, num_shards, tok.vocab_size)
  summary, shard_docs = _tokenize_into(writer, itertools.chain([first], docs), tok, num_workers,
                                       _Progress(progress), read_stats, input_spec)
  summary.update({
      "format_version": store.FORMAT_VERSION, "input": input_spec, "format": fmt,
      "text_field": text_field, "input_files": read_stats["files"],
      "input_bytes": read_stats["bytes"], "replaced_bytes": read_stats["replaced_bytes"],
      "raw_documents": read_stats["raw_documents"], "bad_records": read_stats["bad_records"],
      "num_shards": num_shards,
      "files": list(store.FILES), "token_dtype": writer.dtype.name,
      "shard_documents": shard_docs,
      "vocab": {"path": tok.path, "sha256": tok.sha256, "kind": tok.kind,
                "lowercase": tok.lowercase, "vocab_size": tok.vocab_size},
      "seconds": round(time.time() - start, 2),
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  })
  summary_path.write_text(json.dumps(summary, indent=2))
  logging.info("Prepared %s: %d documents, %d tokens (%d [UNK]); read %s.", output_dir,
               summary["documents"], summary["tokens"], summary["unk_tokens"],
               corpus.format_stats(read_stats))
  return summary


def _tokenize_into(writer: store.ShardWriter, docs, tok, num_workers: int, bar, read_stats: dict,
                   input_spec: str) -> tuple[dict, list]:
  """Tokenizes `docs` in the worker processes and deals them to the writer's shards; returns
  (the counts of the summary, the documents of each shard). The writer's scratch files are
  removed however it ends."""
  summary = {"documents": 0, "sentences": 0, "tokens": 0, "unk_tokens": 0,
             "empty_documents": 0}
  results = _results(docs, tok.path, tok.lowercase, num_workers)
  try:
    for result in results:
      deal_documents(writer, result, summary["documents"])
      summary["documents"] += len(result["document_sentences"])
      for key in ("sentences", "unk_tokens", "empty_documents"):
        summary[key] += result[key]
      summary["tokens"] += result["tokens_count"]
      bar.update(summary, read_stats)
    bar.update(summary, read_stats, final=True)
    if summary["documents"] == 0:
      raise errors.EmptyCorpusError(
          f"Corpus {input_spec!r} holds no text: it produced no documents with tokens "
          f"({read_stats['raw_documents']} raw documents read). Check the files (--input), "
          "and for records their --text_field.")
    return summary, writer.finish()
  finally:
    results.close()  # Whatever stopped the loop.
    writer.discard()


def deal_documents(writer: store.ShardWriter, result: dict, first_document: int) -> None:
  """Writes a task's documents to their shards: corpus document g goes to g % shards."""
  doc_sentences, lengths = result["document_sentences"], result["sentence_lengths"]
  sentence_doc = np.repeat(np.arange(len(doc_sentences)), doc_sentences)
  doc_tokens = np.bincount(sentence_doc, lengths, len(doc_sentences)).astype(np.int64)
  shard = (first_document + np.arange(len(doc_sentences))) % writer.num_shards
  for s in np.unique(shard):
    mine = shard == s
    writer.add(int(s), result["tokens"][np.repeat(mine, doc_tokens)],
               lengths[np.repeat(mine, doc_sentences)], doc_sentences[mine])


def load_summary(prepared_dir: str) -> dict:
  """summary.json of a prepared corpus, with a clear error if the run never finished or
  the directory is of another format."""
  path = prepared_dir.rstrip("/") + "/" + SUMMARY_NAME
  if not fileio.path(path).is_file():
    where = fileio.path(prepared_dir)
    why = ("it does not exist" if not where.exists() else "it is a file, not a directory"
           if not where.is_dir() else f"it has no {SUMMARY_NAME}, which prepare writes last")
    raise errors.PathError(
        f"{prepared_dir} is not a (completely) prepared corpus: {why}. Prepare it with `python "
        f"-m input_pipeline.prepare --input=... --vocab=... --output_dir={prepared_dir}`, or "
        "give the directory prepare wrote.")
  summary = _read_summary(path)
  store.check_format(prepared_dir, summary)
  return summary


def _read_summary(path: str) -> dict:
  try:
    summary = json.loads(fileio.path(path).read_bytes())
    if not isinstance(summary, dict):
      raise ValueError(f"it holds a {type(summary).__name__}")
  except (ValueError, UnicodeDecodeError) as e:
    raise store.DamagedCorpusError(f"{path} is damaged (not a JSON object: {e}). Run "
                                   "prepare again.") from e
  return summary


def convert_legacy(old_dir: str, output_dir: str) -> dict:
  """Converts a prepared corpus of the first format (TFRecord shards) into arrays.

  The token ids are copied shard by shard, nothing is tokenized again, so the converted
  corpus gives the same batches as one prepared afresh from the same text.
  """
  old = _first_format_summary(old_dir)
  if old_dir.rstrip("/") == output_dir.rstrip("/"):
    raise errors.UserError("--output_dir must differ from --convert: the original is read "
                           "while the arrays are written (delete it yourself afterwards).")
  fileio.check_output_dir(output_dir)
  records.tensorflow(_CONVERTING)
  with hold_output(output_dir):
    return _write_converted(old_dir, old, output_dir)


def _first_format_summary(old_dir: str) -> dict:
  """summary.json of a prepared corpus of the first format, its files there; else a
  UserError saying what `old_dir` is instead."""
  flag, where = f"--convert={old_dir}", fileio.path(old_dir)
  if not fileio.path(fileio.join(old_dir, SUMMARY_NAME)).is_file():
    why = ("it does not exist" if not where.exists() else "it is a file, not a directory"
           if not where.is_dir() else f"it has no {SUMMARY_NAME}, so it is not a prepared "
           "corpus of the first format")
    raise errors.PathError(f"{flag}: {why}. --convert takes a directory an earlier bert_jax "
                           "prepared (TFRecord files and summary.json); to prepare text, "
                           "pass --input=... --vocab=... instead.")
  old = _read_summary(fileio.join(old_dir, SUMMARY_NAME))
  version = old.get("format_version", 1)
  if version == store.FORMAT_VERSION:
    raise store.FormatError(f"{flag}: it is already a prepared corpus of arrays: it needs no "
                            "conversion; use it as it is.")
  if version != 1:
    raise store.FormatError(f"{flag}: its format_version is {version!r}, not the first "
                            "format's (1): it cannot be converted.")
  vocab = old.get("vocab")
  for key, present in (("num_shards", "num_shards" in old), ("files", "files" in old),
                       ("shard_documents", "shard_documents" in old),
                       ("vocab.vocab_size", isinstance(vocab, dict) and "vocab_size" in vocab)):
    if not present:
      raise store.FormatError(f"{flag}: its summary.json lacks {key!r}: it is not a prepared "
                              "corpus of the first format, or it is damaged.")
  for name in old["files"]:
    if not fileio.path(fileio.join(old_dir, name)).is_file():
      raise errors.PathError(f"{flag}: {fileio.join(old_dir, name)} is missing: the corpus is "
                             "incomplete. Convert a complete copy, or prepare the text again.")
  return old


def _tf_reason(e: Exception) -> str:
  """A TensorFlow error's message without its op and function names."""
  text = re.sub(r"\{\{.*?\}\}|\[Op:.*$", "", getattr(e, "message", str(e)), flags=re.S)
  return " ".join(text.split())


_CONVERTING = "a prepared corpus of the first format (TFRecord files: prepare --convert)"


def _write_converted(old_dir: str, old: dict, output_dir: str) -> dict:
  tf = records.tensorflow(_CONVERTING)
  summary_path = fileio.path(fileio.join(output_dir, SUMMARY_NAME))
  if summary_path.exists():
    summary_path.unlink()
  start = time.time()
  writer = store.ShardWriter(output_dir, old["num_shards"], old["vocab"]["vocab_size"])
  try:
    for shard, name in enumerate(old["files"]):
      file = fileio.join(old_dir, name)
      try:
        for batch in records.read_documents([file]):
          writer.add(shard, batch["tokens"], batch["sentence_lengths"],
                     batch["sentence_rows"])
      except tf.errors.OpError as e:
        raise store.DamagedCorpusError(f"{file} is damaged ({_tf_reason(e)}): convert an "
                                       "intact copy, or prepare the text again.") from e
    shard_docs = writer.finish()
  finally:
    writer.discard()
  if shard_docs != old["shard_documents"]:
    raise store.DamagedCorpusError(
        f"{old_dir}: its shards hold {shard_docs} documents where its summary.json says "
        f"{old['shard_documents']}: it is damaged. Convert an intact copy, or prepare the "
        "text again.")
  summary = dict(old, format_version=store.FORMAT_VERSION, files=list(store.FILES),
                 token_dtype=writer.dtype.name, converted_from=old_dir,
                 seconds=round(time.time() - start, 2),
                 created=datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"))
  summary_path.write_text(json.dumps(summary, indent=2))
  logging.info("Converted %s into %s: %d documents, %d tokens.", old_dir, output_dir,
               summary["documents"], summary["tokens"])
  return summary


def format_summary(summary: dict) -> str:
  keys = ("documents", "sentences", "tokens", "unk_tokens", "empty_documents",
          "input_files", "input_bytes", "replaced_bytes", "num_shards", "seconds")
  return "\n".join(f"  {k:>16}: {summary[k]:,}" for k in keys)


def flag_values() -> flags.FlagValues:
  # Private FlagValues, so that importing prepare_corpus adds no global flags.
  fv = flags.FlagValues()
  flags.DEFINE_string("input", None, "Corpus: file globs, 'default' or 'tfds:NAME'.",
                      flag_values=fv)
  flags.DEFINE_string("convert", None, "Instead of --input and --vocab: a prepared "
                      "directory of the first format (TFRecord files) to convert into "
                      "--output_dir.", flag_values=fv)
  flags.DEFINE_string("vocab", None, "Vocabulary (vocab.txt, .model or its dir).",
                      flag_values=fv)
  flags.DEFINE_string("output_dir", None, "Output directory.", flag_values=fv)
  flags.DEFINE_integer("num_shards", 16, "Shards of the output (the unit a host reads).",
                       flag_values=fv)
  flags.DEFINE_integer("num_workers", None, "Processes (default: all cores).",
                       flag_values=fv)
  flags.DEFINE_boolean("lowercase", None, "Override the vocabulary's casing.",
                       flag_values=fv)
  corpus.define_flags(fv, "Skip up to this many records without usable text in record "
                      "files (not JSON, no --text_field, not a string), counted in the log "
                      "and summary.json; one more is an error.")
  return fv


def main(argv: list[str]) -> dict:
  fv = flag_values()
  errors.parse_flags(fv, argv, __doc__)
  if fv.convert:
    errors.require_flags(fv, "output_dir")
    summary = convert_legacy(fv.convert, fv.output_dir)
    print(f"Converted {fv.convert} into {fv.output_dir}:\n{format_summary(summary)}")
    return summary
  errors.require_flags(fv, "input", "vocab", "output_dir")
  summary = prepare_corpus(fv.input, fv.vocab, fv.output_dir, lowercase=fv.lowercase,
                           num_shards=fv.num_shards, num_workers=fv.num_workers,
                           **corpus.flag_options(fv))
  print(f"Prepared {fv.output_dir}:\n{format_summary(summary)}")
  return summary


if __name__ == "__main__":
  errors.run_tool(main)
