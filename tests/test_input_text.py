"""Corpus reading: sentence splitting, formats, Gutenberg markers, bad bytes, TFDS, built-in."""
import os
import pathlib
import random
import re
import sys

import pytest

from common import errors
from input_pipeline import builtin_corpus
from input_pipeline import corpus
from input_pipeline import sentences
from input_pipeline import text

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
GUTENBERG = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "gutenberg"


@pytest.mark.parametrize("paragraph, expected", [
    ("Mr. Smith went to Washington. He paid $3.50 for it! Did he? Yes.",
     ["Mr. Smith went to Washington.", "He paid $3.50 for it!", "Did he?", "Yes."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ('"Stop!" he said. She did.', ['"Stop!" he said.', "She did."]),
    ("Use e.g. apples. Or i.e. pears.", ["Use e.g. apples.", "Or i.e. pears."]),
    ("J. R. R. Tolkien wrote it. The U.S. Army came. Dr. Who?",
     ["J. R. R. Tolkien wrote it.", "The U.S. Army came.", "Dr. Who?"]),
    ("Pi is 3.14159 exactly. It was 1984. 2001 came later.",
     ["Pi is 3.14159 exactly.", "It was 1984.", "2001 came later."]),
    ("Wait... What? (Really.) “Yes,” she said. ‘No.’ Fine.",
     ["Wait...", "What?", "(Really.)", "“Yes,” she said.", "‘No.’", "Fine."]),
    ("apples, pears, etc. The next one.", ["apples, pears, etc.", "The next one."]),
    ("no capital after this. so it stays", ["no capital after this. so it stays"]),
    ("", []),
])
def test_split_sentences(paragraph, expected):
  assert sentences.split_sentences(paragraph) == expected


def _read(path, fmt="auto", **kwargs):
  stats = corpus.new_stats()
  return list(corpus.iter_documents(str(path), fmt=fmt, stats=stats, **kwargs)), stats


def test_formats_and_gutenberg_markers(tmp_path):
  lines = tmp_path / "bert.txt"
  lines.write_text("First sentence here.\nSecond one.\n\nOther document.\nIts end!\n")
  docs, _ = _read(lines)
  assert docs == [{"texts": ["First sentence here.", "Second one."], "split": False},
                  {"texts": ["Other document.", "Its end!"], "split": False}]
  book = tmp_path / "book.txt"
  book.write_bytes(
      b"Project Gutenberg header\r\nLicense blah.\r\n"
      b"*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n\r\n"
      b"It was a dark and stormy night; the rain fell in\r\ntorrents. Mr. Jones\r\n"
      b"slept.\r\n\r\nThe end came\r\nsoon.\r\n"
      b"*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nFooter license.\r\n")
  docs, stats = _read(book)
  assert docs == [{"texts": ["It was a dark and stormy night; the rain fell in torrents. "
                             "Mr. Jones slept.", "The end came soon."], "split": True}]
  assert sentences.document_sentences(docs[0]) == [
      "It was a dark and stormy night; the rain fell in torrents.", "Mr. Jones slept.",
      "The end came soon."]
  assert stats["files"] == 1 and stats["bytes"] == book.stat().st_size
  # Forced formats override the guess; no markers -> all text kept.
  docs, _ = _read(book, fmt="lines")
  assert docs[0]["texts"][0] == "It was a dark and stormy night; the rain fell in"
  plain = tmp_path / "plain.txt"
  plain.write_text("Just some words\nwrapped here\n")
  assert _read(plain)[0] == [{"texts": ["Just some words wrapped here"], "split": True}]


def _book(title: str, body: str, footer_lines: int = 3) -> str:
  licence = "".join(f"Licence line {i}.\r\n" for i in range(footer_lines))
  return (f"The Project Gutenberg eBook of {title}\r\n\r\n"
          f"*** START OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n\r\n{body}"
          f"\r\n*** END OF THE PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n{licence}")


def test_every_gutenberg_book_of_a_file_is_its_own_document(tmp_path):
  """Several books concatenated in one file (or one record's text) keep every book, each
  its own document (issue 56 item 1: reading stopped at the first END marker), and the
  bytes counted are the file's own; text after the last END is its footer, dropped."""
  bodies = ["The first book\r\nbegins here.\r\n\r\nIt ends.",
            "The second book,\r\nafter a long licence.",
            "The third\r\nbook.\r\n\r\nIts last\r\nparagraph."]
  joined = (_book("One", bodies[0]) + _book("Two", bodies[1], footer_lines=1500)
            + _book("Three", bodies[2]))
  path = tmp_path / "books.txt"
  path.write_text(joined, newline="")
  docs, stats = _read(path)
  want = [{"texts": ["The first book begins here.", "It ends."], "split": True},
          {"texts": ["The second book, after a long licence."], "split": True},
          {"texts": ["The third book.", "Its last paragraph."], "split": True}]
  assert docs == want
  assert stats["bytes"] == path.stat().st_size and stats["raw_documents"] == 3
  assert text.text_documents(joined) == want  # A record's text reads the same.
  assert "Licence" not in str(docs)


def test_detect_format():
  assert text.detect_format(["One sentence.", "Another one!", "", "Third?"]) == "lines"
  assert text.detect_format(["a wrapped line that goes", "on and on until", "it ends."]) == (
      "paragraphs")


def test_undecodable_bytes_replaced_and_counted(tmp_path):
  path = tmp_path / "bad.txt"
  path.write_bytes(b"Caf\xc3\xa9 ok.\nBad \xff\xfe bytes here.\nTruncated \xe2\x82.\n")
  # 4 bad bytes of 43: above the default limit (1% of a file), accepted under 10%.
  docs, stats = _read(path, fmt="lines", max_replaced_fraction=0.1)
  assert stats["replaced_bytes"] == 4
  assert docs[0]["texts"] == ["Café ok.", "Bad \ufffd\ufffd bytes here.", "Truncated \ufffd."]
  with pytest.raises(text.TooManyReplacedBytesError, match=r"bad.txt: 4 of 43 bytes"):
    _read(path, fmt="lines")


def test_binary_file_is_refused_and_named(tmp_path, caplog):
  """A binary file (random bytes: most are not UTF-8) given as a corpus file is refused
  with an error naming it, the share of bad bytes and the option that raises the limit;
  a text file with a few bad bytes passes, and is named in a warning with its count."""
  good = tmp_path / "good.txt"
  good.write_bytes(b"Plain text here.\n" * 50 + b"One bad \xff byte.\n")  # 1 of 866
  binary = tmp_path / "program.bin"
  binary.write_bytes(random.Random(0).randbytes(100_000))
  with pytest.raises(text.TooManyReplacedBytesError) as e:
    _read(f"{good},{binary}")
  message = str(e.value)
  assert str(binary) in message and "not valid UTF-8" in message
  assert re.search(r"\(\d\d\.\d%\)", message), message  # The share, e.g. "(42.8%)"
  assert "--max_replaced_fraction" in message
  assert "--config.build.max_replaced_fraction" in message
  assert isinstance(e.value, errors.UserError)
  with caplog.at_level("WARNING"):
    docs, stats = _read(good)
  assert stats["replaced_bytes"] == 1 and len(docs) == 1
  assert any(str(good) in r.getMessage() and "1 of 866 bytes" in r.getMessage()
             for r in caplog.records), [r.getMessage() for r in caplog.records]
  _, stats = _read(binary, max_replaced_fraction=1.0)  # Raised limit: read, counted.
  assert stats["replaced_bytes"] > 30_000


def test_missing_and_empty_inputs(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"nothing-here/\*\.txt.*matches no files"):
    list(corpus.iter_documents(str(tmp_path / "nothing-here" / "*.txt")))
  (tmp_path / "a.txt").write_text("x.\n")
  with pytest.raises(FileNotFoundError, match="missing.txt"):  # Every glob must match.
    list(corpus.iter_documents(f"{tmp_path / 'a.txt'},{tmp_path / 'missing.txt'}"))
  with pytest.raises(ValueError, match="No corpus"):
    list(corpus.iter_documents(" "))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  assert _read(empty)[0] == []
  files = text.expand_patterns(f"{tmp_path}/*.txt,{tmp_path / 'a.txt'}")
  assert files == sorted({str(tmp_path / "a.txt"), str(empty)})


def test_builtin_corpus_is_deterministic_and_large():
  texts = builtin_corpus.builtin_texts()
  again = builtin_corpus.builtin_texts.__wrapped__()  # A second child interpreter.
  assert texts == again
  names = [name for name, _ in texts]
  assert "module:json" in names and "topic:assert" in names
  assert not any(n.split(":")[1].split(".")[0] in builtin_corpus.SKIP_MODULES
                 for n in names if n.startswith("module:"))
  assert sum(len(t) for _, t in texts) > 1_000_000
  stats = corpus.new_stats()
  docs = list(corpus.iter_documents("default", stats=stats))
  assert len(docs) == stats["raw_documents"] and len(docs) > 300
  assert list(corpus.iter_documents("builtin"))[:3] == docs[:3]


def test_tfds_local_corpus(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class TinyTextCorpus(tfds.core.GeneratorBasedBuilder):
    """Three documents, generated locally: nothing to download."""
    VERSION = tfds.core.Version("1.0.0")
    # A top-level module name: TFDS then skips looking for checksum files beside the
    # builder's package, a path that needs the (absent) importlib_resources package.
    __module__ = "tiny_text_corpus_builder"

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"title": tfds.features.Text(), "body": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(3):
        yield i, {"title": f"Doc {i}", "body": f"Paragraph one of doc {i}. Second sentence.\n"
                                               f"Paragraph two of doc {i}."}

  builder = TinyTextCorpus(data_dir=str(tmp_path))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      try_download_gcs=False))
  with pytest.raises(ValueError, match="no field 'text'"):
    list(corpus.iter_documents("tfds:tiny_text_corpus", tfds_data_dir=str(tmp_path)))
  docs = list(corpus.iter_documents("tfds:tiny_text_corpus", text_field="body",
                                    tfds_data_dir=str(tmp_path)))
  # Read as a text file holding the body: its single newline is a wrap inside a paragraph.
  assert len(docs) == 3 and all(d["split"] for d in docs)
  assert sentences.document_sentences(docs[0]) == [
      "Paragraph one of doc 0.", "Second sentence.", "Paragraph two of doc 0."]
  with pytest.raises(errors.PathError, match="not prepared.*tfds build"):
    list(corpus.iter_documents("tfds:tiny_text_corpus", tfds_data_dir=str(tmp_path / "x")))
  with pytest.raises(errors.PathError, match="unknown to tensorflow_datasets") as e:
    list(corpus.iter_documents("tfds:no_such_corpus", tfds_data_dir=str(tmp_path)))
  assert "\n" not in str(e.value)  # one line (TFDS's own message lists its search path)


def test_inputs_read_through_tensorflow_without_it_are_one_line(tmp_path, monkeypatch):
  """On an image without TensorFlow (or TFDS), every data input that reads through it (a
  `tfds:` corpus for prepare and vocab, GLUE's data_dir=tfds, prepare --convert, original BERT
  TFRecords) is refused in one line saying what needs it and how to install it, exit 2,
  nothing written (issue 56 item 10)."""
  from input_pipeline import glue  # pylint: disable=g-import-not-at-top
  from input_pipeline import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  from input_pipeline import prepare  # pylint: disable=g-import-not-at-top
  from input_pipeline import testing  # pylint: disable=g-import-not-at-top
  from input_pipeline import vocab  # pylint: disable=g-import-not-at-top
  install = ("install it with `pip install -c constraints.txt tensorflow-cpu "
             "tensorflow-datasets` in the bert_jax repository")
  for name in ("tensorflow", "tensorflow_datasets"):
    monkeypatch.setitem(sys.modules, name, None)
  words = testing.write_vocab(str(tmp_path / "vocab.txt"), ["a"])
  spec = "tfds:wikipedia/20230601.en"
  for main, flags in ((prepare.main, [f"--vocab={words}", f"--output_dir={tmp_path / 'p'}"]),
                      (vocab.main, [f"--output={tmp_path / 'v'}"])):
    line = testing.refusal(main, ["cli", f"--input={spec}", *flags])
    assert f"TensorFlow is needed for the TFDS corpus '{spec}' and does not import" in line
    assert install in line, line
  with pytest.raises(errors.MissingDependencyError, match=r"TensorFlow is needed for GLUE's "
                     r"cola from TFDS \(glue/cola; data_dir=tfds\)"):
    glue.read_tfds_glue("cola", "dev", str(tmp_path))
  old = tmp_path / "old"
  old.mkdir()
  (old / "summary.json").write_text('{"num_shards": 1, "files": ["d.tfrecord"], '
                                    '"shard_documents": [1], "vocab": {"vocab_size": 9}}')
  (old / "d.tfrecord").write_bytes(b"")
  line = testing.refusal(prepare.main, ["prepare", f"--convert={old}",
                                        f"--output_dir={tmp_path / 'new'}"])
  assert "TensorFlow is needed for a prepared corpus of the first format" in line, line
  line = testing.refusal(inspect_lib.main, ["inspect", f"--tfrecord_pattern={old}/d.tfrecord",
                                            f"--vocab={words}", "--max_seq_length=8",
                                            "--max_predictions_per_seq=2"])
  assert "TensorFlow is needed for original BERT TFRecords" in line, line
  # Nothing written: not even the empty --output_dir the refused prepare had made (issue 56).
  assert sorted(p.name for p in tmp_path.iterdir()) == ["old", "vocab.txt"]


@pytest.mark.data
def test_gutenberg_books_are_stripped():
  books = sorted(GUTENBERG.glob("pg*.txt"))[:5]
  if not books:
    pytest.skip(f"{GUTENBERG} not present (only on the project's machines)")
  for book in books:
    docs, stats = _read(book)
    assert len(docs) == 1 and docs[0]["split"] and stats["replaced_bytes"] == 0
    lines = book.read_text(encoding="utf-8").splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("***") and "START OF" in l)
    end = next(i for i, l in enumerate(lines) if l.startswith("***") and "END OF" in l)
    body = [l.strip() for l in lines[start + 1:end] if l.strip()]
    assert docs[0]["texts"][0].startswith(body[0])
    assert docs[0]["texts"][-1].endswith(body[-1])
