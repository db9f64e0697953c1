"""Free text -> documents of sentences or paragraphs: text files, and the text of a record.

A *raw document* is a dict {"texts": [str, ...], "split": bool}: `texts` are sentences
(split=False, original BERT "lines" format) or paragraphs that still need sentence
splitting (split=True). Splitting happens later, in the prepare workers, so the reader
stays a cheap single-threaded stream.

One reading of free text, whatever holds it: a text file, or the text field of one record
of a JSON Lines / JSON / Parquet / Arrow file, a `datasets` directory or a TFDS dataset
(`text_documents`), so the same string gives the same documents and sentences from each.
Formats (of a file, or of each record's text):
  lines       one sentence per line (google-research/bert): a line is a sentence as it
              stands, a blank line ends a document.
  paragraphs  free text: a single newline is a hard wrap inside a paragraph (the lines are
              joined with a space), a blank line ends a paragraph, the whole text is one
              document (a book is one document); paragraphs are sentence-split.
  auto        "lines" if at least 80% of the first 200 non-blank lines end with sentence
              punctuation (optionally followed by a closing quote or bracket) and fewer
              than half of them hold more than one sentence, else "paragraphs".
              Hard-wrapped prose ends most lines mid-sentence, a paragraph on each line
              (Wikipedia's records) holds several sentences a line, BERT-format text ends
              almost every line with the full stop of its one sentence.

Project Gutenberg text keeps only what lies between each `*** START OF` line and the next
`*** END OF` (when the markers are present); a text holding several books gives each book
its own documents. Undecodable UTF-8 bytes become U+FFFD and are counted in
`stats["replaced_bytes"]`, and a file with any is named in a warning; a file where they
are more than `max_replaced_fraction` of the bytes read (default 1%: a binary file, or
another encoding) is refused with an error naming it.
"""
import codecs
import itertools
import json
import re
from typing import Callable, Iterable, Iterator

from absl import logging

from common import errors
from common import fileio
from input_pipeline import sentences as sentences_lib

FORMATS = ("auto", "lines", "paragraphs")
_READ_CHUNK_BYTES = 8 << 20
# A START marker later than this is not a Gutenberg header: treat the text as plain.
_HEADER_LOOKAHEAD_LINES = 1000
_AUTO_SAMPLE_LINES = 200
# Dialogue-heavy hard-wrapped prose ends up to ~60% of its lines with punctuation; text
# with one sentence per line ends nearly all of them so.
_AUTO_LINES_FRACTION = 0.8
# ... and hold one sentence each; a text with a paragraph on each line (Wikipedia's records)
# holds several in most of its lines.
_AUTO_SEVERAL_FRACTION = 0.5
# The largest share of a file's bytes that may be undecodable (replaced by U+FFFD).
MAX_REPLACED_FRACTION = 0.01
# "*** START OF THE PROJECT GUTENBERG EBOOK X ***", also written "***START OF ...".
_START = re.compile(r"\*\*\*\s*START OF")
_END = re.compile(r"\*\*\*\s*END OF")

# --------------------------------------------------------------------------- files


def expand_patterns(patterns: str,
                    expand_dir: Callable[[str], list[str]] | None = None) -> list[str]:
  """Comma-separated globs -> sorted unique file list; every glob must match something.
  A matched directory counts as the files `expand_dir` gives for it (none by default)."""
  files = []
  for pattern in (p.strip() for p in patterns.split(",")):
    if not pattern:
      continue
    matched, directories = [], []
    for m in fileio.glob(pattern):
      if not fileio.path(m).is_dir():
        matched.append(m)
      elif expand_dir is not None and (found := expand_dir(m)):
        matched.extend(found)
      else:
        directories.append(m)
    if not matched:
      raise errors.PathError(_no_files(pattern, directories))
    files.extend(matched)
  if not files:
    raise ValueError(f"No input files given (input={patterns!r}).")
  return sorted(set(files))


def _no_files(pattern: str, directories: list[str]) -> str:
  """Why a corpus pattern gave no file to read, and what to give instead."""
  if directories == [pattern]:
    return (f"{pattern} is a directory, not a corpus file (nor a HuggingFace `datasets` "
            "directory written by save_to_disk): give the files in it, e.g. "
            f"'{pattern.rstrip('/')}/*.txt'.")
  if directories:
    shown = ", ".join(directories[:3]) + (", ..." if len(directories) > 3 else "")
    return (f"Input pattern {pattern!r} matches directories only ({shown}), no corpus file: "
            "give the files in them, e.g. 'DIR/*.txt'.")
  return (f"Input pattern {pattern!r} matches no files. Check the path (globs such as "
          "'data/*.txt' and comma-separated lists are accepted), or give 'default' for the "
          "built-in corpus.")


# Undecodable bytes seen by this process; read_lines adds the change to its stats.
_replaced = [0]


def _replace_and_count(err: UnicodeDecodeError):
  _replaced[0] += err.end - err.start
  return "\ufffd", err.end


codecs.register_error("input_pipeline_replace", _replace_and_count)


def decode_bytes(data: bytes, stats: dict) -> str:
  """UTF-8 decode; undecodable bytes become U+FFFD and are counted in stats."""
  before = _replaced[0]
  text = data.decode("utf-8", errors="input_pipeline_replace")
  stats["replaced_bytes"] += _replaced[0] - before
  return text


class TooManyReplacedBytesError(errors.UserError, ValueError):
  """A file of the corpus is mostly not UTF-8 text (binary, or another encoding)."""


def check_replaced(path: str, replaced: int, total: int,
                   max_fraction: float = MAX_REPLACED_FRACTION) -> None:
  """Refuses a file whose undecodable bytes are more than max_fraction of `total`."""
  if total and replaced > max_fraction * total:
    raise TooManyReplacedBytesError(
        f"{path}: {replaced:,} of {total:,} bytes read ({replaced / total:.1%}) are not "
        f"valid UTF-8, more than the limit of {max_fraction:.1%} per file. Is it a binary "
        "file or in another encoding? Leave it out of the corpus or convert it to UTF-8; "
        "to accept it with its bad bytes replaced by U+FFFD, raise --max_replaced_fraction "
        "(the training job: --config.build.max_replaced_fraction).")


def read_lines(path: str, stats: dict,
               max_replaced_fraction: float = MAX_REPLACED_FRACTION) -> Iterator[str]:
  """Streams the decoded lines of a file (no line ends), in large binary chunks.

  Splitting on b"\\n" before decoding is safe: 0x0A never occurs inside a multi-byte
  UTF-8 sequence. Adds to stats["bytes"] and stats["replaced_bytes"]. Undecodable bytes
  are checked against max_replaced_fraction of the bytes read so far after every chunk
  (a binary file fails before its first line) and at the end; a file with any is named in
  a warning once its reading ends (also when the reader stops early, e.g. at a Gutenberg
  END marker).
  """
  tail, read, replaced_before, refused = b"", 0, stats["replaced_bytes"], False

  def check():
    nonlocal refused
    refused = True
    check_replaced(path, stats["replaced_bytes"] - replaced_before, read,
                   max_replaced_fraction)
    refused = False

  try:
    with fileio.open_read(path) as f:  # .gz / .zst decompressed
      while True:
        chunk = f.read(_READ_CHUNK_BYTES)
        if not chunk:
          break
        stats["bytes"] += len(chunk)
        read += len(chunk)
        chunk = tail + chunk
        cut = chunk.rfind(b"\n") + 1
        tail = chunk[cut:]
        lines = decode_bytes(chunk[:cut], stats).split("\n")[:-1]
        check()
        for line in lines:
          yield line.rstrip("\r")
    if tail:
      last = decode_bytes(tail, stats).rstrip("\r")
      check()
      yield last
  finally:
    replaced = stats["replaced_bytes"] - replaced_before
    if replaced and not refused:
      logging.warning("%s: %d of %d bytes read (%.3f%%) are not valid UTF-8; replaced by "
                      "U+FFFD (the limit is %.1f%% per file).", path, replaced, read,
                      100 * replaced / read, 100 * max_replaced_fraction)


def json_objects(lines: Iterable[str], path: str, error: Callable[[str], Exception]
                 ) -> Iterator[tuple[int, dict]]:
  """(line number, object) of each non-blank line of JSON Lines text; a line that is not
  one JSON object raises `error(message)`, the message naming the file and line."""
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      raise error(f"{path}:{n}: not JSON ({e}): a JSON Lines file holds one JSON object "
                  "per line.") from None
    if not isinstance(record, dict):
      raise error(f"{path}:{n}: a JSON {type(record).__name__}, not an object: a JSON Lines "
                  "file holds one object ({field: value}) per line.")
    yield n, record


def strip_gutenberg(lines: Iterable[str]) -> Iterator[str | None]:
  """Drops Project Gutenberg headers and footers; other text passes unchanged.

  Every book of the text is kept: the lines between each `*** START OF` line and the next
  `*** END OF`, with None yielded before every book after the first (a file may hold
  several books, concatenated). What lies after an END up to the next START is a footer
  and the next book's header, dropped. Inside a book only an END counts: a second START
  there (some books repeat their header's marker, pg148) is kept as a line of the book.
  """
  lines, head = iter(lines), []
  in_book = True
  for line in lines:
    if _START.match(line):
      head = []  # Header found: everything before it is dropped.
      break
    if _END.match(line):
      in_book = False
      break
    head.append(line)
    if len(head) >= _HEADER_LOOKAHEAD_LINES:
      break
  yield from head
  for line in lines:
    if in_book:
      if _END.match(line):
        in_book = False
      else:
        yield line
    elif _START.match(line):
      yield None
      in_book = True


def _books(lines: Iterator[str | None]) -> Iterator[Iterator[str]]:
  """The lines of each book of strip_gutenberg's stream, streamed (each book is to be read
  through before the next is asked for)."""
  for is_break, book in itertools.groupby(lines, key=lambda line: line is None):
    if not is_break:
      yield book


_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")


def detect_format(lines: list[str]) -> str:
  """'lines' if most non-blank lines end a sentence and hold one, else 'paragraphs' (see
  module doc)."""
  sample = [l.strip() for l in lines if l.strip()][:_AUTO_SAMPLE_LINES]
  if not sample:
    return "paragraphs"
  ending = sum(bool(_SENTENCE_END.search(l)) for l in sample)
  if ending < _AUTO_LINES_FRACTION * len(sample):
    return "paragraphs"
  several = sum(map(sentences_lib.holds_several, sample))
  return "lines" if several < _AUTO_SEVERAL_FRACTION * len(sample) else "paragraphs"


def _lines_documents(lines: Iterator[str]) -> Iterator[dict]:
  doc = []
  for line in lines:
    line = line.strip()
    if line:
      doc.append(line)
    elif doc:
      yield {"texts": doc, "split": False}
      doc = []
  if doc:
    yield {"texts": doc, "split": False}


def join_paragraphs(lines) -> list[str]:
  """Joins hard-wrapped lines; blank lines end a paragraph."""
  paragraphs, current = [], []
  for line in lines:
    line = line.strip()
    if line:
      current.append(line)
    elif current:
      paragraphs.append(" ".join(current))
      current = []
  if current:
    paragraphs.append(" ".join(current))
  return paragraphs


def _check_format(fmt: str) -> None:
  if fmt not in FORMATS:
    raise ValueError(f"Unknown text format {fmt!r}; use one of {FORMATS}.")


def iter_file_documents(path: str, fmt: str, stats: dict,
                        max_replaced_fraction: float = MAX_REPLACED_FRACTION
                        ) -> Iterator[dict]:
  """Raw documents of one text file (format per module docstring)."""
  _check_format(fmt)
  yield from lines_documents(read_lines(path, stats, max_replaced_fraction), fmt)


def text_documents(text: str, fmt: str = "auto") -> list[dict]:
  """Raw documents of a text held in a record (JSON, Parquet, Arrow, TFDS): exactly those of
  a text file holding that string, so the same text gives the same documents and sentences
  whatever its container."""
  _check_format(fmt)
  return list(lines_documents((line.rstrip("\r") for line in text.split("\n")), fmt))


def lines_documents(lines: Iterator[str], fmt: str) -> Iterator[dict]:
  """Raw documents of a text's lines (without line ends): the one reading of free text
  (module doc), for files and records alike. The format is guessed once for the whole
  text; each Gutenberg book of it gives its own documents."""
  lines = strip_gutenberg(lines)
  if fmt == "auto":
    sample, nonblank = [], 0
    for line in lines:
      sample.append(line)
      nonblank += bool(line and line.strip())
      if nonblank >= _AUTO_SAMPLE_LINES:
        break
    fmt = detect_format([line for line in sample if line is not None])
    lines = itertools.chain(sample, lines)
  for book in _books(lines):
    if fmt == "lines":
      yield from _lines_documents(book)
    else:
      paragraphs = join_paragraphs(book)
      if paragraphs:
        yield {"texts": paragraphs, "split": True}
