"""Corpus sources -> a stream of raw documents ({"texts": [...], "split": bool}).

An input spec is one of:
  "default" / "builtin"   the built-in corpus (Python's own documentation, no download);
  "tfds:NAME[:SPLIT]"     a TFDS text dataset already prepared under tfds_data_dir
                          (e.g. "tfds:wikipedia/20230601.en"); each example's `text_field`
                          is a document, its lines are paragraphs. Nothing is downloaded;
  anything else           comma-separated file globs (local or gs://), see text.py.
"""
import difflib
import sys
from typing import Callable, Iterator

from absl import flags
from absl import logging

from bert_jax import errors
from input_pipeline import builtin_corpus
from input_pipeline import sentences as sentences_lib
from input_pipeline import text as text_lib

BUILTIN_NAMES = ("default", "builtin")


def new_stats() -> dict:
  return {"files": 0, "bytes": 0, "replaced_bytes": 0, "raw_documents": 0}


def iter_documents(input_spec: str, *, fmt: str = "auto", text_field: str = "text",
                   tfds_data_dir: str | None = None, stats: dict | None = None,
                   max_replaced_fraction: float = text_lib.MAX_REPLACED_FRACTION
                   ) -> Iterator[dict]:
  """Raw documents of a corpus, streamed; counts go to `stats` (see new_stats).

  A file whose undecodable bytes are more than max_replaced_fraction of its bytes is
  refused (text.TooManyReplacedBytesError, naming it).
  """
  stats = new_stats() if stats is None else stats
  if not input_spec or not input_spec.strip():
    raise ValueError("No corpus given: pass file globs, 'default' or 'tfds:NAME'.")
  if input_spec.strip() in BUILTIN_NAMES:
    source = builtin_corpus.iter_builtin_documents(stats)
  elif input_spec.startswith("tfds:"):
    source = iter_tfds_documents(input_spec[len("tfds:"):], text_field=text_field,
                                 data_dir=tfds_data_dir, stats=stats)
  else:
    source = _iter_files(text_lib.expand_patterns(input_spec), fmt, stats,
                         max_replaced_fraction)
  for doc in source:
    stats["raw_documents"] += 1
    yield doc


def _iter_files(files: list[str], fmt: str, stats: dict, max_replaced_fraction: float
                ) -> Iterator[dict]:
  for path in files:
    stats["files"] += 1
    yield from text_lib.iter_file_documents(path, fmt, stats, max_replaced_fraction)


def format_stats(stats: dict) -> str:
  """The read counts as one phrase for logs, replaced (undecodable) bytes included."""
  replaced = stats["replaced_bytes"]
  share = f" ({replaced / stats['bytes']:.3%})" if stats["bytes"] and replaced else ""
  files = f"{stats['files']:,} files, " if stats["files"] else ""
  return (f"{files}{stats['bytes']:,} bytes, {stats['raw_documents']:,} documents; "
          f"{replaced:,} bytes not valid UTF-8{share} replaced by U+FFFD")


def load_tfds_split(name: str, *, data_dir: str | None):
  """tfds.load(download=False) with an error that says how to prepare the dataset."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (optional: only TFDS corpora)
  name, _, split = name.partition(":")
  split = split or "train"
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError and friends.
    raise FileNotFoundError(
        f"TFDS dataset {name!r} is unknown to tensorflow_datasets ({e}).") from e
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"TFDS dataset {name!r} is not prepared under data_dir={builder.data_dir_root!r}. "
        "Nothing is downloaded at run time: prepare it once where the network is "
        f"available, e.g. `tfds build {name} --data_dir=DIR`, then pass "
        "--tfds_data_dir=DIR.")
  return builder.as_dataset(split=split, shuffle_files=False)


def iter_tfds_documents(name: str, *, text_field: str, data_dir: str | None,
                        stats: dict) -> Iterator[dict]:
  ds = load_tfds_split(name, data_dir=data_dir)
  if text_field not in ds.element_spec:
    raise ValueError(f"TFDS dataset {name!r} has no field {text_field!r}; its fields are "
                     f"{sorted(ds.element_spec)}. Set --text_field.")
  for example in ds.as_numpy_iterator():
    raw = example[text_field]
    stats["bytes"] += len(raw)
    text = text_lib.decode_bytes(raw, stats)
    paragraphs = [line.strip() for line in text.split("\n") if line.strip()]
    if paragraphs:
      yield {"texts": paragraphs, "split": True}


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


# --------------------------------------------------------------------- command-line tools
# The input_pipeline tools (vocab, prepare, inspect) parse absl flags into private
# FlagValues (importing them adds no global flags); these give them one behaviour.

HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")


def parse_flags(fv: flags.FlagValues, argv: list[str], usage: str) -> None:
  """Parses argv (absl syntax) into fv. --help (also -h, -?, --helpshort, --helpfull)
  prints `usage` and the flags, then exits 0; an unknown or malformed flag, or an
  argument that is not a flag, is an errors.UserError."""
  if any(a in HELP_FLAGS or a.startswith("--help=") for a in argv[1:]):
    # absl's help lists flags under their module's file name: the flags alone here.
    listing = [l for l in fv.get_help(include_special_flags=False).splitlines()
               if l.startswith(" ")]
    print(usage.strip() + "\n\nFlags:\n" + "\n".join(listing))
    raise SystemExit(0)
  try:
    rest = fv(argv)
    if "config" in fv and fv["config"].present:
      fv["config"].value.keys()  # Config files load lazily: fail here, not mid-run.
  except flags.UnrecognizedFlagError as e:
    if e.flagname.startswith("config.") and "config" in fv and fv["config"].present:
      raise errors.UserError(_unknown_config_field(fv["config"].value, e.flagname)) from e
    raise errors.UserError(f"{e} (see --help)") from e
  except flags.Error as e:
    raise errors.UserError(f"{e} (see --help)") from e
  except OSError as e:  # A --config file that does not load.
    raise errors.UserError(f"--config={fv['config'].config_filename}: cannot load the "
                           f"config file: {str(e).strip().splitlines()[-1].strip()}") from e
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # --config.x.y=... overrides
    while e.args and isinstance(e.args[0], BaseException):  # ml_collections nests them.
      e = e.args[0]
    text = str(e.args[0]) if e.args else str(e)
    lines = [l.strip().strip("'\"") for l in text.strip("'\"").split("\n") if l.strip()]
    overrides = [a.split("=")[0] for a in argv[1:] if a.startswith("--config.")
                 and lines and lines[0] in a.split("=")[0].split(".")[1:]]
    lead = (f"{overrides[0]}: the config has no field {lines[0]!r}" if overrides
            else f"bad config override: {lines[0] if lines else e!r}")
    raise errors.UserError(" ".join([lead + "."] + lines[1:])) from e
  if len(rest) > 1:
    raise errors.UserError(f"Unexpected arguments {rest[1:]}: every option is a "
                           "--flag=value (see --help).")


def _unknown_config_field(config, flagname: str) -> str:
  """`--config.a.b=...` naming no field: the message, with the closest field's name."""
  *parents, leaf = flagname.split(".")[1:]
  node = config
  for name in parents:
    node = node.get(name) if hasattr(node, "get") else None
  message = f"--{flagname}: the config has no field {leaf!r}."
  close = difflib.get_close_matches(leaf, list(node.keys()), n=1) if hasattr(
      node, "keys") else []
  return message + (f' Did you mean "{close[0]}" instead of "{leaf}"?' if close else "")


def require_flags(fv: flags.FlagValues, *names: str) -> None:
  missing = [n for n in names if fv[n].value in (None, "")]
  if missing:
    raise errors.UserError(f"Missing required flags: {', '.join('--' + m for m in missing)} "
                           "(see --help).")


def run_tool(main: Callable[[list[str]], object]) -> None:
  """`python -m input_pipeline.TOOL`: INFO logs on stderr, and an errors.UserError as one
  line `TOOL: error: ...` with exit status 2 (no traceback)."""
  flags.FLAGS(sys.argv[:1])  # absl logging reads the global flags: their defaults.
  logging.use_absl_handler()
  logging.set_verbosity(logging.INFO)
  errors.reported(main)(sys.argv)
