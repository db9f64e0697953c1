"""Corpus sources -> a stream of raw documents ({"texts": [...], "split": bool}).

An input spec is one of:
  "default" / "builtin"   the built-in corpus (Python's own documentation, no download);
  "tfds:NAME[:SPLIT]"     a TFDS text dataset already prepared under tfds_data_dir
                          (e.g. "tfds:wikipedia/20230601.en"); each example's `text_field`
                          is read as a text file holding it (text.py). Nothing is downloaded;
  anything else           comma-separated file globs (local or gs://): plain text
                          (text.py; .gz / .zst decompressed), JSON Lines, Parquet, Arrow,
                          and HuggingFace `datasets` directories (sources.py), the reader
                          chosen by each file's name; a record's `text_field` is read as a
                          text file holding that string would be (text.text_documents).
"""
from typing import Iterator

from absl import flags

from common import errors
from input_pipeline import builtin_corpus
from input_pipeline import records
from input_pipeline import sentences as sentences_lib
from input_pipeline import sources
from input_pipeline import text as text_lib

BUILTIN_NAMES = ("default", "builtin")


def new_stats() -> dict:
  return {"files": 0, "bytes": 0, "replaced_bytes": 0, "raw_documents": 0, "bad_records": 0}


def iter_documents(input_spec: str, *, fmt: str = "auto", text_field: str = "text",
                   tfds_data_dir: str | None = None, stats: dict | None = None,
                   max_replaced_fraction: float = text_lib.MAX_REPLACED_FRACTION,
                   max_bad_records: int = 0) -> Iterator[dict]:
  """Raw documents of a corpus, streamed; counts go to `stats` (see new_stats).

  A file whose undecodable bytes are more than max_replaced_fraction of its bytes is
  refused (text.TooManyReplacedBytesError, naming it). Records without usable text in
  record files are errors beyond `max_bad_records` in the whole corpus (sources.py).
  """
  stats = new_stats() if stats is None else stats
  if not input_spec or not input_spec.strip():
    raise ValueError("No corpus given: pass file globs, 'default' or 'tfds:NAME'.")
  if input_spec.strip() in BUILTIN_NAMES:
    source = builtin_corpus.iter_builtin_documents(stats)
  elif input_spec.startswith("tfds:"):
    source = iter_tfds_documents(input_spec[len("tfds:"):], text_field=text_field,
                                 data_dir=tfds_data_dir, stats=stats, fmt=fmt)
  else:
    files = text_lib.expand_patterns(input_spec, expand_dir=sources.dataset_files)
    source = _iter_files(files, fmt, stats, max_replaced_fraction, text_field,
                         max_bad_records)
  for doc in source:
    stats["raw_documents"] += 1
    yield doc


def _iter_files(files: list[str], fmt: str, stats: dict, max_replaced_fraction: float,
                text_field: str, max_bad_records: int) -> Iterator[dict]:
  for path in files:
    stats["files"] += 1
    kind = sources.record_kind(path)
    if kind is not None:
      yield from sources.iter_record_documents(
          path, kind, text_field=text_field, stats=stats, max_bad_records=max_bad_records,
          max_replaced_fraction=max_replaced_fraction, fmt=fmt)
      continue
    count = [0]
    docs = text_lib.iter_file_documents(path, fmt, stats, max_replaced_fraction)
    for doc in sources.guarded(path, docs, lambda: f"{count[0]} documents"):
      count[0] += 1
      yield doc


def format_stats(stats: dict) -> str:
  """The read counts as one phrase for logs, replaced (undecodable) bytes included."""
  replaced = stats["replaced_bytes"]
  share = f" ({replaced / stats['bytes']:.3%})" if stats["bytes"] and replaced else ""
  files = f"{stats['files']:,} files, " if stats["files"] else ""
  bad = stats.get("bad_records", 0)
  skipped = f"; {bad:,} bad records skipped" if bad else ""
  return (f"{files}{stats['bytes']:,} bytes, {stats['raw_documents']:,} documents; "
          f"{replaced:,} bytes not valid UTF-8{share} replaced by U+FFFD{skipped}")


def load_tfds_split(name: str, *, data_dir: str | None):
  """tfds.load(download=False) with an error that says how to prepare the dataset."""
  tfds = records.tensorflow_datasets(f"the TFDS corpus 'tfds:{name}'")
  name, _, split = name.partition(":")
  split = split or "train"
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError and friends.
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise errors.PathError(
        f"TFDS dataset {name!r} is unknown to tensorflow_datasets ({first_line}). Check the "
        "name after 'tfds:' and --tfds_data_dir.") from e
  if not builder.is_prepared():
    raise errors.PathError(
        f"TFDS dataset {name!r} is not prepared under data_dir={str(builder.data_dir_root)!r}. "
        "Nothing is downloaded at run time: prepare it once where the network is "
        f"available, e.g. `tfds build {name} --data_dir=DIR`, then pass "
        "--tfds_data_dir=DIR.")
  return builder.as_dataset(split=split, shuffle_files=False)


def iter_tfds_documents(name: str, *, text_field: str, data_dir: str | None,
                        stats: dict, fmt: str = "auto") -> Iterator[dict]:
  ds = load_tfds_split(name, data_dir=data_dir)
  if text_field not in ds.element_spec:
    raise ValueError(f"TFDS dataset {name!r} has no field {text_field!r}; its fields are "
                     f"{sorted(ds.element_spec)}. Set --text_field.")
  for example in ds.as_numpy_iterator():
    raw = example[text_field]
    stats["bytes"] += len(raw)
    yield from text_lib.text_documents(text_lib.decode_bytes(raw, stats), fmt)


def iter_texts(input_spec: str, *, sentences: bool = False, max_chars: int | None = None,
               **kwargs) -> Iterator[str]:
  """Paragraphs (or sentences) of a corpus, up to about max_chars characters."""
  total = 0
  for doc in iter_documents(input_spec, **kwargs):
    texts = sentences_lib.document_sentences(doc) if sentences else doc["texts"]
    for t in texts:
      yield t
      total += len(t)
      if max_chars and total >= max_chars:
        return


def define_flags(fv: flags.FlagValues, bad_records_help: str) -> None:
  """The flags that say how a corpus is read, for the tools that read one (prepare, vocab)."""
  flags.DEFINE_enum("format", "auto", ["auto", "lines", "paragraphs"],
                    "How free text (a text file, or a record's text) is read: see "
                    "input_pipeline/text.py.", flag_values=fv)
  flags.DEFINE_string("text_field", "text", "The field (JSON), column (Parquet, Arrow) or "
                      "TFDS feature holding a document's text.", flag_values=fv)
  flags.DEFINE_integer("max_bad_records", 0, bad_records_help, flag_values=fv)
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir.", flag_values=fv)
  flags.DEFINE_float("max_replaced_fraction", text_lib.MAX_REPLACED_FRACTION,
                     "Refuse a corpus file when more than this share of its bytes is not "
                     "valid UTF-8 (replaced by U+FFFD).", flag_values=fv)


def flag_options(fv: flags.FlagValues) -> dict:
  """define_flags' values (and --format) as the keyword arguments of the tools' functions
  (vocab.train_vocab, prepare.prepare_corpus)."""
  return dict(fmt=fv.format, text_field=fv.text_field, tfds_data_dir=fv.tfds_data_dir,
              max_replaced_fraction=fv.max_replaced_fraction,
              max_bad_records=fv.max_bad_records)
