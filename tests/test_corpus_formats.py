"""Corpus files in every input format (input_pipeline/sources.py): the same documents give
the same prepared corpus whatever the format; bad records, wrong fields and damaged files
are one clear error naming the file and record; --max_bad_records skips and counts."""
import gzip
import json
import pathlib
import random
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from input_pipeline import corpus
from input_pipeline import prepare
from input_pipeline import sources
from input_pipeline import store
from input_pipeline import testing
from tests import test_train_utils as tu
from tests.gcs_emulator import gcs  # noqa: F401  pylint: disable=unused-import

GUTENBERG = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "gutenberg"
WORDS = ("the cat sat on a mat . it was warm ! dogs ran far away ? yes no maybe "
         "rain fell all day long").split()

# Documents as paragraphs of sentences (what a user's record holds, "\n\n" between
# paragraphs), one of them blank (no document).
DOCS = [
    "The cat sat on a mat. It was warm!\n\nDogs ran far away? Yes.",
    "Rain fell all day long.",
    "   \n",
    "No. Maybe the dogs sat.\nThe cat ran far away. It was warm.\n\n\nYes!",
    "A mat. A cat. A dog? No.",
]


@pytest.fixture
def vocab(tmp_path):
  return testing.write_vocab(str(tmp_path / "vocab" / "vocab.txt"),
                             list(dict.fromkeys(WORDS + ["dog", "[unused0]"])))


def _jsonl(records) -> bytes:
  return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


def _records(docs=DOCS):
  return [{"id": i, "text": d, "meta": {"source": "test"}} for i, d in enumerate(docs)]


def _write_formats(root) -> dict[str, str]:
  """DOCS in every format -> {name: input spec}."""
  root.mkdir(parents=True, exist_ok=True)
  specs = {}
  text_dir = root / "text"
  text_dir.mkdir()
  for i, doc in enumerate(DOCS):  # one document a file, the record's own string
    (text_dir / f"doc{i:02d}.txt").write_text(doc)
  specs["txt"] = str(text_dir / "*.txt")
  gz_dir = root / "textgz"
  gz_dir.mkdir()
  for path in sorted(text_dir.iterdir()):
    (gz_dir / (path.name + ".gz")).write_bytes(gzip.compress(path.read_bytes()))
  specs["txt.gz"] = str(gz_dir / "*.txt.gz")
  data = _jsonl(_records())
  (root / "c4.jsonl").write_bytes(data)
  specs["jsonl"] = str(root / "c4.jsonl")
  (root / "c4.json.gz").write_bytes(gzip.compress(data))
  specs["json.gz"] = str(root / "c4.json.gz")
  (root / "pile.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
  specs["jsonl.zst"] = str(root / "pile.jsonl.zst")
  (root / "array.json").write_text(json.dumps(_records(), indent=1))
  specs["json array"] = str(root / "array.json")
  # Two files, split mid-corpus: the reader keeps file order, then record order.
  table = pa.table({"id": list(range(len(DOCS))), "text": DOCS})
  pq.write_table(table.slice(0, 2), root / "wiki-00000.parquet")
  pq.write_table(table.slice(2), root / "wiki-00001.parquet", row_group_size=1)
  specs["parquet"] = str(root / "wiki-*.parquet")
  return specs


def _prepared(spec, vocab, out, **kwargs):
  summary = prepare.prepare_corpus(spec, vocab, str(out), num_shards=2, num_workers=1,
                                   progress=False, **kwargs)
  arrays = {name: (out / name).read_bytes() for name in store.FILES}
  return summary, arrays


def test_every_format_prepares_the_same_corpus(tmp_path, vocab):
  specs = _write_formats(tmp_path / "in")
  datasets = pytest.importorskip("datasets")
  hf = tmp_path / "in" / "hf"
  datasets.Dataset.from_dict({"text": DOCS, "id": list(range(len(DOCS)))}).save_to_disk(
      str(hf), num_shards=2)
  specs["datasets dir"] = str(hf)
  want_summary, want = _prepared(specs["txt"], vocab, tmp_path / "out-txt")
  # "sat.\nThe" is a hard wrap after a word that also abbreviates Saturday: one sentence.
  assert want_summary["documents"] == 4 and want_summary["sentences"] == 13
  for name, spec in specs.items():
    if name == "txt":
      continue
    summary, arrays = _prepared(spec, vocab, tmp_path / f"out-{name}")
    assert arrays == want, name
    for key in ("documents", "sentences", "tokens", "unk_tokens", "shard_documents"):
      assert summary[key] == want_summary[key], (name, key)
    assert summary["bad_records"] == 0


def test_a_mixed_glob_reads_each_file_by_its_name(tmp_path):
  specs = _write_formats(tmp_path)
  mixed = ",".join([specs["jsonl"], specs["parquet"], specs["txt.gz"]])
  docs = list(corpus.iter_documents(mixed))
  one = list(corpus.iter_documents(specs["jsonl"]))
  assert len(one) == 4 and docs == one + one + one


def test_record_kinds_from_the_file_name():
  kinds = {"a.jsonl": "json", "A.JSONL.GZ": "json", "c4-train.00000-of-01024.json.gz": "json",
           "x.jsonl.zst": "json", "x.ndjson": "json", "w.parquet": "parquet",
           "data-00000-of-00001.arrow": "arrow", "book.txt": None, "book.txt.gz": None,
           "notes": None, "x.json.bak": None}
  assert {name: sources.record_kind(name) for name in kinds} == kinds


def _docs(spec, **kwargs):
  stats = corpus.new_stats()
  return list(corpus.iter_documents(spec, stats=stats, **kwargs)), stats


BAD_LINES = [
    ({"text": "Good one."}, None),
    ({"body": "x"}, "line 2 has no field 'text' (its fields: ['body'])"),
    ({"text": None}, "line 3 holds null in field 'text', not a string"),
    ("not json", "line 4 is not valid JSON"),
    ({"text": ["a", "list"]}, "line 5 holds list in field 'text', not a string"),
    ([1, 2], "line 6 is a JSON list, not an object"),
    ({"text": "Last good."}, None),
]


def _bad_file(tmp_path):
  path = tmp_path / "bad.jsonl"
  lines = [r if isinstance(r, str) else json.dumps(r) for r, _ in BAD_LINES]
  path.write_text("\n".join(lines) + "\n")
  return path


def test_bad_records_are_named_then_skipped_when_allowed(tmp_path):
  path = _bad_file(tmp_path)
  problems = [p for _, p in BAD_LINES if p]
  for allowed, problem in enumerate(problems):  # each allowance fails at the next one
    with pytest.raises(sources.BadRecordError) as e:
      _docs(str(path), max_bad_records=allowed)
    message = str(e.value)
    assert message.startswith(f"{path}: {problem}"), message
    assert f"--max_bad_records=N (now {allowed}" in message
  docs, stats = _docs(str(path), max_bad_records=len(problems))
  assert [d["texts"] for d in docs] == [["Good one."], ["Last good."]]
  assert stats["bad_records"] == 5 and stats["raw_documents"] == 2
  assert "5 bad records skipped" in corpus.format_stats(stats)


def test_the_allowance_is_for_the_whole_corpus(tmp_path):
  first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  for path in (first, second):
    path.write_text(_jsonl([{"text": "Fine."}, {"text": None}]).decode())
  _docs(f"{first},{second}", max_bad_records=2)
  with pytest.raises(sources.BadRecordError, match=f"{second}: line 2 holds null"):
    _docs(f"{first},{second}", max_bad_records=1)


@pytest.mark.parametrize("first,problem", [
    ({"body": "x"}, "line 1 has no field 'text' (its fields: ['body'])"),
    ("this is not json", "line 1 is not valid JSON"),
    ('"a string"', "line 1 is a JSON str, not an object"),
])
def test_the_first_record_is_strict(tmp_path, first, problem):
  path = tmp_path / "data.jsonl"
  path.write_text((first if isinstance(first, str) else json.dumps(first)) + "\n"
                  + json.dumps({"text": "Fine."}) + "\n")
  with pytest.raises(sources.BadRecordError) as e:
    _docs(str(path), max_bad_records=100)
  assert str(e.value).startswith(f"{path}: {problem}")
  assert "--text_field" in str(e.value)


def test_text_field_names_another_field(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text(_jsonl([{"content": "Hello there. Bye."}]).decode())
  docs, _ = _docs(str(path), text_field="content")
  assert docs == [{"texts": ["Hello there. Bye."], "split": True}]


def test_damaged_compressed_files_are_named(tmp_path):
  data = _jsonl(_records() * 50)
  gz = gzip.compress(data)
  (tmp_path / "cut.jsonl.gz").write_bytes(gz[:len(gz) // 2])
  flipped = bytearray(gz)
  flipped[len(gz) // 2] ^= 0xFF
  (tmp_path / "flipped.jsonl.gz").write_bytes(bytes(flipped))
  zst = bytearray(zstandard.ZstdCompressor().compress(data))
  zst[len(zst) // 2:len(zst) // 2 + 8] = b"\x00" * 8
  (tmp_path / "bad.jsonl.zst").write_bytes(bytes(zst))
  (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"Some text. More.\n" * 100)[:40])
  (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really parquet")
  for name in ("cut.jsonl.gz", "flipped.jsonl.gz", "bad.jsonl.zst", "cut.txt.gz",
               "bad.parquet"):
    with pytest.raises(sources.DamagedFileError) as e:
      _docs(str(tmp_path / name))
    assert str(e.value).startswith(f"{tmp_path / name}: damaged after "), str(e.value)
    assert "leave it out of --input" in str(e.value)


def test_truncated_zstandard_files_are_damaged_not_short(tmp_path):
  """A .zst cut anywhere inside a frame is damage, whatever the framing (one frame, a
  streamed frame, several frames; text or JSON Lines), never a shorter file read as complete
  nor records for --max_bad_records to skip (issue 35, item 1)."""
  data = _jsonl(_records() * 400)
  text = b"".join(b"Line %d of a book. Another sentence.\n" % i for i in range(20000))
  one = zstandard.ZstdCompressor().compress(data)
  streamed = zstandard.ZstdCompressor().compressobj()
  streamed = streamed.compress(data) + streamed.flush()
  frames = b"".join(zstandard.ZstdCompressor().compress(data[i:i + 4000])
                    for i in range(0, len(data), 4000))
  (tmp_path / "one.jsonl.zst").write_bytes(one[:len(one) // 2])
  (tmp_path / "streamed.jsonl.zst").write_bytes(streamed[:len(streamed) // 2])
  (tmp_path / "frames.jsonl.zst").write_bytes(frames[:len(frames) // 2 + 3])
  txt = zstandard.ZstdCompressor().compress(text)
  (tmp_path / "book.txt.zst").write_bytes(txt[:len(txt) // 2])
  (tmp_path / "whole.jsonl.zst").write_bytes(frames)
  (tmp_path / "whole.jsonl").write_bytes(data)
  assert _docs(str(tmp_path / "whole.jsonl.zst"))[0] == _docs(str(tmp_path / "whole.jsonl"))[0]
  for name in ("one.jsonl.zst", "streamed.jsonl.zst", "frames.jsonl.zst", "book.txt.zst"):
    for bad in (0, 10**6):
      with pytest.raises(sources.DamagedFileError) as e:
        _docs(str(tmp_path / name), max_bad_records=bad)
      assert str(e.value).startswith(f"{tmp_path / name}: damaged after "), str(e.value)
      assert "ends inside a Zstandard frame" in str(e.value), str(e.value)


def test_parquet_columns_are_checked_and_nulls_are_bad_records(tmp_path):
  path = tmp_path / "t.parquet"
  pq.write_table(pa.table({"id": [1, 2, 3], "text": ["One.", None, "Three."]}), path)
  with pytest.raises(sources.BadRecordError, match=r"t.parquet: row 2 holds null"):
    _docs(str(path))
  docs, stats = _docs(str(path), max_bad_records=1)
  assert len(docs) == 2 and stats["bad_records"] == 1
  with pytest.raises(sources.BadRecordError, match=r"no column 'body' \(its columns: \['id', "
                     r"'text'\]\)"):
    _docs(str(path), text_field="body")
  with pytest.raises(sources.BadRecordError, match="column 'id' holds int64, not strings"):
    _docs(str(path), text_field="id")


def test_a_datasets_dict_asks_for_a_split(tmp_path):
  datasets = pytest.importorskip("datasets")
  ds = datasets.Dataset.from_dict({"text": DOCS})
  datasets.DatasetDict({"train": ds, "validation": ds}).save_to_disk(str(tmp_path / "dd"))
  with pytest.raises(Exception, match=r"DatasetDict with the splits \['train', 'validation'\]"
                     r": give the directory of the split to read, e.g. --input=.*dd/train"):
    _docs(str(tmp_path / "dd"))
  docs, stats = _docs(str(tmp_path / "dd" / "train"))
  assert len(docs) == 4 and stats["files"] == 1


def test_prepare_counts_skipped_records_and_the_cli_error_is_one_line(tmp_path, vocab):
  path = _bad_file(tmp_path)
  summary, _ = _prepared(str(path), vocab, tmp_path / "out", max_bad_records=5)
  assert summary["bad_records"] == 5 and summary["documents"] == 2
  proc = subprocess.run(
      [sys.executable, "-m", "input_pipeline.prepare", f"--input={path}", f"--vocab={vocab}",
       f"--output_dir={tmp_path / 'out2'}", "--num_workers=1", "--max_bad_records=1"],
      cwd=tu.REPO, env=tu.env(1), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert lines[-1] == (f"prepare.py: error: {path}: line 3 holds null in field 'text', not a "
                       "string. Fix or remove the record, or allow skipping a few with "
                       "--max_bad_records=N (now 1; the training job: "
                       "--config.build.max_bad_records)."), proc.stderr[-3000:]
  assert not (tmp_path / "out2" / prepare.SUMMARY_NAME).exists()


def test_prepared_arrays_hold_the_record_text(tmp_path, vocab):
  """Not only equal across formats: the tokens are the documents' own."""
  specs = _write_formats(tmp_path / "in")
  _prepared(specs["jsonl.zst"], vocab, tmp_path / "out")
  summary = prepare.load_summary(str(tmp_path / "out"))
  arrays = store.open_arrays(str(tmp_path / "out"), summary)
  from input_pipeline import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.Tokenizer.from_path(vocab)
  first_sentence = tok.encode_batch(["The cat sat on a mat."])[0]
  assert np.asarray(arrays["tokens"][:len(first_sentence)]).tolist() == list(first_sentence)


_GS_PREPARE = """
import json, sys
from input_pipeline import prepare, store
spec, vocab, out = sys.argv[1:4]
summary = prepare.prepare_corpus(spec, vocab, out, num_shards=2, num_workers=1, progress=False)
print(json.dumps({"documents": summary["documents"], "files": summary["input_files"]}))
"""


def test_record_files_on_gs(gcs, tmp_path, vocab):  # noqa: F811
  """JSON Lines (gzip) and Parquet (read with seeks) from a bucket: the same arrays as
  from the local files."""
  specs = _write_formats(tmp_path / "in")
  remote = gcs.fresh_prefix() + "/corpus"
  local = [tmp_path / "in" / "c4.json.gz", *sorted((tmp_path / "in").glob("wiki-*.parquet"))]
  for path in local:
    gcs.write_object(f"{remote}/{path.name}", path.read_bytes())
  spec = f"{remote}/c4.json.gz,{remote}/wiki-*.parquet"
  proc = subprocess.run([sys.executable, "-c", _GS_PREPARE, spec, vocab, str(tmp_path / "gs-out")],
                        cwd=tu.REPO, env={**tu.env(1), **gcs.env()}, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"documents": 8, "files": 3}
  _, want = _prepared(f"{specs['json.gz']},{specs['parquet']}", vocab, tmp_path / "out")
  assert {name: (tmp_path / "gs-out" / name).read_bytes() for name in store.FILES} == want


def test_a_corpus_without_text_is_one_line(tmp_path, vocab):
  """A Parquet file of no rows (or any input with no text) is the user's input, named in one
  line (issue 35, item 7), not a traceback; nothing is written."""
  path = tmp_path / "norows.parquet"
  pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
  proc = subprocess.run(
      [sys.executable, "-m", "input_pipeline.prepare", f"--input={path}", f"--vocab={vocab}",
       f"--output_dir={tmp_path / 'out'}"],
      cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert f"Corpus '{path}' is empty: 1 files, 0 bytes, no text" in proc.stderr
  assert not (tmp_path / "out" / "summary.json").exists()


def _hard_wrapped_books(n: int = 24, seed: int = 0) -> list[str]:
  """Books as Project Gutenberg ships them: a header and licence around the text, lines
  wrapped at 60 columns (CRLF in some), blank lines between paragraphs, headings."""
  rng = random.Random(seed)
  books = []
  for b in range(n):
    paragraphs = [f"CHAPTER {b}"]
    for _ in range(rng.randint(3, 8)):
      sentences = []
      for _ in range(rng.randint(1, 6)):
        words = [rng.choice([w for w in WORDS if w.isalpha()]) for _ in range(rng.randint(2, 14))]
        sentences.append(" ".join(words).capitalize() + rng.choice([".", "!", "?"]))
      paragraphs.append(textwrap.fill(" ".join(sentences), 60))
    body = "\n\n".join(paragraphs)
    text = (f"The Project Gutenberg eBook of Book {b}\n\nmeta data\n\n*** START OF THE PROJECT "
            f"GUTENBERG EBOOK BOOK {b} ***\n\n{body}\n\n*** END OF THE PROJECT GUTENBERG EBOOK "
            f"BOOK {b} ***\n\nlicence text\n")
    books.append(text.replace("\n", "\r\n") if b % 3 == 0 else text)
  return books


def test_hard_wrapped_books_prepare_the_same_in_every_container(tmp_path, vocab):
  """The same strings as .txt files, .jsonl.gz records, Parquet, a JSON array and a
  `datasets` directory give byte-identical prepared arrays (issue 35 item 3: a record's
  single newlines were read as paragraph ends, cutting each hard-wrapped sentence)."""
  books = _hard_wrapped_books()
  root = tmp_path / "in"
  (root / "txt").mkdir(parents=True)
  for i, book in enumerate(books):
    (root / "txt" / f"book{i:02d}.txt").write_bytes(book.encode("utf-8"))
  records = [{"text": book} for book in books]
  (root / "books.jsonl.gz").write_bytes(gzip.compress(_jsonl(records)))
  (root / "books.json").write_text(json.dumps(records))
  pq.write_table(pa.table({"text": books}), root / "books.parquet", row_group_size=5)
  specs = {"jsonl.gz": root / "books.jsonl.gz", "json array": root / "books.json",
           "parquet": root / "books.parquet"}
  datasets = pytest.importorskip("datasets")
  datasets.Dataset.from_dict({"text": books}).save_to_disk(str(root / "hf"), num_shards=2)
  specs["datasets dir"] = root / "hf"
  want_summary, want = _prepared(str(root / "txt" / "*.txt"), vocab, tmp_path / "out-txt")
  assert want_summary["documents"] == len(books)
  # Every sentence is whole: one ends with its punctuation, the next begins with a capital.
  summary = prepare.load_summary(str(tmp_path / "out-txt"))
  arrays = store.open_arrays(str(tmp_path / "out-txt"), summary)
  from input_pipeline import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.Tokenizer.from_path(vocab)
  ends = {tok.convert_tokens_to_ids([p])[0] for p in ".!?"}
  starts = np.asarray(arrays["sentence_starts"])
  tokens = np.asarray(arrays["tokens"])
  headings = {int(d) for d in np.asarray(arrays["document_starts"])[:-1]}
  for i, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
    if i not in headings:  # a book's first sentence is its heading
      assert tokens[e - 1] in ends, tok.decode(tokens[s:e])
  for name, spec in specs.items():
    summary, arrays = _prepared(str(spec), vocab, tmp_path / f"out-{name}")
    assert arrays == want, name
    assert summary["sentences"] == want_summary["sentences"], name


@pytest.mark.parametrize("text,documents,sentences", [
    ("One cat sat.\nTwo dogs ran.\nIt was warm!\n\nRain fell.\nYes.\n", 2, 5),  # BERT's lines
    ("The cat sat on\na mat. It was\nwarm!\n\nDogs ran.\n", 1, 3),                # hard-wrapped
    ("The cat ran. It was warm!\nDogs ran far away? Yes.\n", 1, 4),              # a paragraph a line
])
def test_a_record_reads_as_a_text_file_holding_it(tmp_path, text, documents, sentences):
  """How a blank line, a single newline and a line of BERT's format are read, the same in a
  .txt file and in a record (text.py's module doc)."""
  from input_pipeline import sentences as sentences_lib  # pylint: disable=g-import-not-at-top
  (tmp_path / "a.txt").write_text(text)
  (tmp_path / "a.jsonl").write_bytes(_jsonl([{"text": text}]))
  pq.write_table(pa.table({"text": [text]}), tmp_path / "a.parquet")
  want = list(corpus.iter_documents(str(tmp_path / "a.txt")))
  assert len(want) == documents
  assert sum(len(sentences_lib.document_sentences(d)) for d in want) == sentences
  for name in ("a.jsonl", "a.parquet"):
    assert list(corpus.iter_documents(str(tmp_path / name))) == want, name


@pytest.mark.data
def test_24_gutenberg_books_prepare_the_same_as_txt_jsonl_gz_and_parquet(tmp_path, vocab):
  """Issue 35 item 3 as probed: 24 real books (hard-wrapped, CRLF, Gutenberg markers) as
  .txt files, as .jsonl.gz records and as a Parquet column give byte-identical arrays."""
  books = sorted(GUTENBERG.glob("pg*.txt"))[:24]
  if len(books) < 24:
    pytest.skip(f"{GUTENBERG} not present (only on the project's machines)")
  texts = [b.read_bytes().decode("utf-8", errors="replace") for b in books]
  (tmp_path / "books.jsonl.gz").write_bytes(gzip.compress(_jsonl([{"text": t} for t in texts])))
  pq.write_table(pa.table({"text": texts}), tmp_path / "books.parquet")
  want_summary, want = _prepared(",".join(map(str, books)), vocab, tmp_path / "out-txt")
  assert want_summary["documents"] == 24
  for name in ("books.jsonl.gz", "books.parquet"):
    summary, arrays = _prepared(str(tmp_path / name), vocab, tmp_path / f"out-{name}")
    assert summary["sentences"] == want_summary["sentences"], name
    assert arrays == want, name


@pytest.mark.slow
def test_a_prepared_directory_on_gs_has_a_writer_lock(gcs, tmp_path, vocab):  # noqa: F811
  """gs:// (no flock): another host's live writer is refused in one line; its lock is taken
  over once its heartbeat is stale, and released at the end (issue 35 item 5). (16 shards
  of 4 documents: an empty shard on gs:// has no scratch file, which stopped prepare.)"""
  import time  # pylint: disable=g-import-not-at-top
  specs = _write_formats(tmp_path / "in")
  out = gcs.fresh_prefix() + "/prepared"
  other = {"host": "another-host", "pid": 1, "processes": 1, "started": time.time(),
           "heartbeat": time.time()}
  gcs.write_object(f"{out}/LOCK", json.dumps(other).encode())
  env = {**tu.env(1), **gcs.env()}
  args = [sys.executable, "-m", "input_pipeline.prepare", f"--input={specs['jsonl']}",
          f"--vocab={vocab}", f"--output_dir={out}", "--num_workers=1"]
  refused = subprocess.run(args, cwd=tu.REPO, env=env, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert refused.stderr.strip().splitlines()[-1].startswith(
      f"prepare.py: error: the prepared corpus {out} is in use by process 1 on host "
      "another-host"), refused.stderr[-3000:]
  assert [o for o in gcs.list_objects(out) if not o.endswith("/LOCK")] == []
  gcs.write_object(f"{out}/LOCK", json.dumps({**other, "heartbeat": time.time() - 3600}).encode())
  taken = subprocess.run(args, cwd=tu.REPO, env=env, capture_output=True, text=True, timeout=300)
  assert taken.returncode == 0, taken.stderr[-3000:]
  assert "whose heartbeat stopped" in taken.stderr
  assert f"{out}/LOCK" not in gcs.list_objects(out)


def test_truncated_multi_member_gzip_is_damaged_not_short(tmp_path):
  """gzip members (as concatenated .gz files are): a file cut inside a later member is damage,
  even with --max_bad_records (issue 35 item 1, gzip framing)."""
  data = _jsonl(_records() * 400)
  members = b"".join(gzip.compress(data[i:i + 4000]) for i in range(0, len(data), 4000))
  (tmp_path / "whole.jsonl.gz").write_bytes(members)
  assert len(_docs(str(tmp_path / "whole.jsonl.gz"))[0]) == 4 * 400
  for name in ("cut.jsonl.gz", "cut.txt.gz"):
    (tmp_path / name).write_bytes(members[:len(members) // 2 + 7])
    for bad in (0, 10**6):
      with pytest.raises(sources.DamagedFileError, match=f"^{tmp_path / name}: damaged after "):
        _docs(str(tmp_path / name), max_bad_records=bad)
