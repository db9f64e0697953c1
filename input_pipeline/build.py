"""The pre-training job's data step: resolve the data config's paths (relative ones live in
the workdir), and build the vocabulary and prepared corpus there when `config.build.corpus`
says so and they are missing (process 0 builds, the others wait).
"""
from __future__ import annotations

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections

from common import fileio
from input_pipeline import data_config
from input_pipeline import documents
from input_pipeline import mixture as mixture_lib
from input_pipeline import prepare as prepare_lib
from input_pipeline import tokenizer as tokenizer_lib
from input_pipeline import vocab as vocab_lib


def vocab_complete(vocab_path: str) -> bool:
  """A vocabulary built here is complete once its marker is written. Without the marker:
  a user's file or directory, or one built before markers existed (by a rename that
  finished: its `.tmp` source is gone)."""
  p = fileio.path(vocab_path)
  if not p.exists():
    return False
  return fileio.is_complete(p) or not fileio.path(vocab_path.rstrip("/") + ".tmp").exists()


def _build(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict,
           vocab_kind: str) -> None:
  """Trains the vocabulary (config.build.vocab_kind, or `vocab_kind` where that is empty) and
  tokenizes the corpus where they are missing (process 0).

  A corpus file with more than build.max_replaced_fraction of bytes that are not UTF-8
  fails the build (errors.UserError naming it and the field)."""
  build = config.build
  if data_cfg.vocab_path and not vocab_complete(data_cfg.vocab_path):
    vocab_kind = build.get("vocab_kind") or vocab_kind
    logging.info("Training a %d-entry %s vocabulary on %r into %s.", build.vocab_size,
                 vocab_kind, build.corpus, data_cfg.vocab_path)
    tmp = data_cfg.vocab_path.rstrip("/") + ".tmp"
    for leftover in (tmp, data_cfg.vocab_path):  # of a build that was killed
      if fileio.path(leftover).exists():
        fileio.path(leftover).rmtree()
    vocab_lib.train_vocab(build.corpus, tmp, vocab_size=build.vocab_size,
                          kind=vocab_kind, lowercase=data_cfg.lowercase,  # None: the kind's
                          max_chars=build.max_chars, text_field=build.text_field,
                          max_replaced_fraction=build.max_replaced_fraction,
                          max_bad_records=build.max_bad_records)
    # Atomic on local disks; on GCS a copy then a delete, hence the marker written last.
    fileio.path(tmp).rename(fileio.path(data_cfg.vocab_path))
    fileio.mark_complete(data_cfg.vocab_path)
    logging.info("Vocabulary ready: %s.", data_cfg.vocab_path)
  summary = fileio.join(data_cfg.prepared_dir, prepare_lib.SUMMARY_NAME)
  if data_cfg.prepared_dir and not fileio.path(summary).exists():
    logging.info("Preparing corpus %r into %s.", build.corpus, data_cfg.prepared_dir)
    prepare_lib.prepare_corpus(build.corpus, data_cfg.vocab_path, data_cfg.prepared_dir,
                               lowercase=data_cfg.lowercase, num_shards=build.num_shards,
                               progress=False, text_field=build.text_field,
                               max_replaced_fraction=build.max_replaced_fraction,
                               max_bad_records=build.max_bad_records)


def _check_splits(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict,
                  summary: dict) -> None:
  """documents.TooFewDocumentsError for a corpus too small to hold documents out, saying
  how to rebuild it when the job built it (a prepared directory is built once)."""
  try:
    documents.eval_document_count(summary["documents"], data_cfg.eval_fraction, data_cfg.nsp,
                                  data_cfg.prepared_dir)
  except documents.TooFewDocumentsError as e:
    if not config.build.corpus:
      raise
    raise documents.TooFewDocumentsError(
        f"{e} It was prepared from --config.build.corpus={config.build.corpus}: delete "
        f"{data_cfg.prepared_dir} for the job to prepare it again.") from e


def build_data(config: ml_collections.ConfigDict, workdir: str, vocab_kind: str = "wordpiece"
               ) -> tuple[ml_collections.ConfigDict, int | None]:
  """Resolves the data config's paths (relative ones live in the workdir), builds the
  vocabulary and prepared corpus when `config.build.corpus` says so and they are
  missing (process 0 builds, the others wait), and returns (data config, vocab size).
  `vocab_kind`: what to train where config.build.vocab_kind names no kind (the model
  family's)."""
  if config.synthetic_data:
    return ml_collections.ConfigDict(config.data.to_dict()), None
  data_cfg = data_config.resolve_paths(config.data, workdir)
  if config.build.corpus:
    if jax.process_index() == 0:
      _build(config, data_cfg, vocab_kind)
    multihost_utils.sync_global_devices("bert_jax_data_built")
  if data_cfg.get("mixture"):
    first = mixture_lib.parse_mixture(data_cfg.mixture)[0][0]
    summary = prepare_lib.load_summary(first)
    logging.info("Mixture of prepared corpora %s (temperature %s); vocabulary %s (%d entries).",
                 data_cfg.mixture, data_cfg.get("mixture_temperature") or "1",
                 summary["vocab"]["path"], summary["vocab"]["vocab_size"])
    return data_cfg, int(summary["vocab"]["vocab_size"])
  if data_cfg.prepared_dir:
    summary = prepare_lib.load_summary(data_cfg.prepared_dir)
    if not data_cfg.get("tfrecord_pattern"):  # too small to split: refused before the model
      _check_splits(config, data_cfg, summary)
    logging.info("Prepared corpus %s: %s documents, %s tokens, vocabulary %s (%d entries); "
                 "%s of its %s input bytes were not valid UTF-8 (replaced by U+FFFD).",
                 data_cfg.prepared_dir, f"{summary['documents']:,}",
                 f"{summary['tokens']:,}", summary["vocab"]["path"],
                 summary["vocab"]["vocab_size"], f"{summary.get('replaced_bytes', 0):,}",
                 f"{summary.get('input_bytes', 0):,}")
    return data_cfg, int(summary["vocab"]["vocab_size"])
  if data_cfg.vocab_path:
    return data_cfg, tokenizer_lib.Tokenizer.from_path(data_cfg.vocab_path).vocab_size
  return data_cfg, None


def vocab_of(config: ml_collections.ConfigDict, data_cfg: ml_collections.ConfigDict) -> str | None:
  """The vocabulary the run's data is tokenized with (`data_cfg`: build_data's): data.vocab_path,
  else the prepared corpus's (the first of a mixture); None for synthetic data or none found."""
  if config.synthetic_data:
    return None
  if data_cfg.get("vocab_path"):
    return data_cfg.vocab_path
  prepared = (mixture_lib.parse_mixture(data_cfg.mixture)[0][0] if data_cfg.get("mixture")
              else data_cfg.get("prepared_dir"))
  return prepare_lib.load_summary(prepared)["vocab"]["path"] if prepared else None
