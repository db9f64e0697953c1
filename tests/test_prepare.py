"""prepare: CLI end to end, record format, worker-count independence, original BERT records."""
import json
import mmap
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from input_pipeline import documents
from input_pipeline import inspect as inspect_lib
from input_pipeline import data_config
from input_pipeline import prepare
from input_pipeline import pretrain
from input_pipeline import records
from input_pipeline import store
from input_pipeline import testing
from input_pipeline import text
from input_pipeline import tokenizer as tokenizer_lib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BOOK = ("*** START OF THE PROJECT GUTENBERG EBOOK T ***\r\n\r\n"
        "Chapter one begins here. Mr. Brown d{i}w1 walked\r\nhome. It rained!\r\n\r\n"
        "Second paragraph d{i}w2 of book {i}. Bad byte \xff here.\r\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK T ***\r\nlicense\r\n")


@pytest.fixture
def books(tmp_path):
  words = ("chapter one begins here . mr brown walked home it rained ! second paragraph of "
           "book bad byte here").split() + [str(i) for i in range(6)]
  vocab = testing.write_vocab(str(tmp_path / "vocab" / "vocab.txt"),  # each token once
                              list(dict.fromkeys(words + testing.tagged_words(6, 3) + ["[unused0]"])))
  for i in range(6):
    text = BOOK.format(i=i).encode("utf-8").replace("\xff".encode("utf-8"), b"\xff")
    (tmp_path / f"book{i}.txt").write_bytes(text)
  return {"glob": str(tmp_path / "book*.txt"), "vocab": vocab, "root": tmp_path}


def _read_all(prepared_dir):
  """(summary, [(token ids, sentence lengths)] of every document in corpus order)."""
  summary = prepare.load_summary(prepared_dir)
  arrays = store.open_arrays(prepared_dir, summary)
  tokens, sent_start = arrays["tokens"], arrays["sentence_starts"]
  doc_start, docs, position = arrays["document_starts"], {}, 0
  for shard, count in enumerate(summary["shard_documents"]):
    for r in range(count):  # Shard after shard; record r of shard s is document r*S + s.
      first, stop = doc_start[position], doc_start[position + 1]
      docs[r * summary["num_shards"] + shard] = (
          tokens[sent_start[first]:sent_start[stop]].tolist(),
          np.diff(sent_start[first:stop + 1]).tolist())
      position += 1
  return summary, [docs[i] for i in range(len(docs))]


def test_prepare_cli_end_to_end(books):
  out = str(books["root"] / "prepared")
  summary = prepare.main(["prepare", f"--input={books['glob']}", f"--vocab={books['vocab']}",
                          f"--output_dir={out}", "--num_shards=4", "--num_workers=2"])
  on_disk, docs = _read_all(out)
  assert on_disk == json.loads(json.dumps(summary))
  assert summary["documents"] == 6 and summary["sentences"] == 6 * 5
  assert summary["input_files"] == 6 and summary["replaced_bytes"] == 6
  assert summary["tokens"] == sum(len(t) for t, _ in docs)
  assert summary["shard_documents"] == [2, 2, 1, 1] and summary["num_shards"] == 4
  assert summary["vocab"]["sha256"] == tokenizer_lib.Tokenizer.from_path(books["vocab"]).sha256
  tok = tokenizer_lib.Tokenizer.from_path(books["vocab"])
  for i, (tokens, lengths) in enumerate(docs):  # Documents keep corpus order.
    assert sum(lengths) == len(tokens) and min(lengths) >= 1
    sentences = np.split(np.array(tokens), np.cumsum(lengths)[:-1])
    assert [" ".join(tok.convert_ids_to_tokens(s)) for s in sentences] == [
        "chapter one begins here .", f"mr . brown d{i}w1 walked home .", "it rained !",
        f"second paragraph d{i}w2 of book {i} .", "bad byte here ."]  # BERT drops U+FFFD.
  # The output does not depend on the number of workers.
  again = str(books["root"] / "again")
  prepare.prepare_corpus(books["glob"], books["vocab"], again, num_shards=4, num_workers=1,
                         progress=False)
  for name in summary["files"]:
    assert open(os.path.join(out, name), "rb").read() == open(
        os.path.join(again, name), "rb").read()


def _write_first_format(prepared_dir, out):
  """The prepared corpus in the first format, as prepare wrote it before the arrays: one
  TFRecord file of tf.train.Example documents per shard, summary.json without
  format_version."""
  summary, docs = _read_all(prepared_dir)
  num_shards = summary["num_shards"]
  names = [f"docs-{s:05d}-of-{num_shards:05d}.tfrecord" for s in range(num_shards)]
  os.makedirs(out)
  writers = [tf.io.TFRecordWriter(os.path.join(out, n)) for n in names]
  for g, (tokens, lengths) in enumerate(docs):
    writers[g % num_shards].write(records.encode_document(
        np.split(np.array(tokens), np.cumsum(lengths)[:-1])))
  for w in writers:
    w.close()
  old = {k: v for k, v in summary.items() if k not in ("format_version", "token_dtype")}
  with open(os.path.join(out, prepare.SUMMARY_NAME), "w") as f:
    json.dump(dict(old, files=names), f)
  return out


def test_first_format_is_refused_with_the_command_that_converts_it(tmp_path):
  corpus = testing.make_tagged_corpus(str(tmp_path / "c"), num_docs=9, num_shards=3)
  old = _write_first_format(corpus["prepared"], str(tmp_path / "old"))
  cfg = data_config.default_data_config()
  cfg.prepared_dir, cfg.vocab_path = old, corpus["vocab"]
  with pytest.raises(store.FormatError, match=r"first format \(TFRecord files\).*python -m "
                     r"input_pipeline\.prepare --convert=.*old --output_dir=NEW_DIR"):
    pretrain.PretrainIterator(cfg, batch_size=8, seed=0)
  new = str(tmp_path / "new")
  converted = prepare.main(["prepare", f"--convert={old}", f"--output_dir={new}"])
  assert converted["format_version"] == store.FORMAT_VERSION
  assert converted["shard_documents"] == corpus["summary"]["shard_documents"]
  for name in store.FILES:  # The same arrays as prepared from the text.
    assert open(os.path.join(new, name), "rb").read() == open(
        os.path.join(corpus["prepared"], name), "rb").read(), name
  assert not os.path.exists(os.path.join(new, store.SCRATCH))
  batches = []
  for prepared in (corpus["prepared"], new):
    cfg.prepared_dir = prepared
    it = pretrain.PretrainIterator(cfg, batch_size=8, seed=0, process_index=1,
                                   process_count=2)
    batches.append([next(it) for _ in range(3)])
    it.close()
  for a, b in zip(*batches):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  with pytest.raises(ValueError, match="needs no conversion"):
    prepare.convert_legacy(new, str(tmp_path / "again"))


def test_convert_of_what_is_not_a_first_format_corpus_is_one_line(tmp_path):
  """prepare --convert given a directory that is not a prepared corpus of the first format
  (missing, a file, a plain directory, arrays already, a summary.json that does not parse or
  describes no such corpus, its TFRecord files missing or damaged): one line naming it and
  what to do, exit 2, nothing written (issue 56 item 10)."""
  new = tmp_path / "new"
  run = lambda old: testing.refusal(prepare.main, ["prepare", f"--convert={old}",
                                                   f"--output_dir={new}"])
  assert f"--convert={tmp_path / 'nope'}: it does not exist" in run(tmp_path / "nope")
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  assert f"--convert={a_file}: it is a file, not a directory" in run(a_file)
  old = tmp_path / "old"
  old.mkdir()
  line = run(old)
  assert f"--convert={old}: it has no summary.json, so it is not a prepared corpus of the " \
      "first format" in line and "--input=... --vocab=..." in line, line
  summary = old / prepare.SUMMARY_NAME
  summary.write_text(json.dumps({"format_version": 2, "documents": 3}))
  assert "it is already a prepared corpus of arrays: it needs no conversion" in run(old)
  summary.write_text("{oops")
  assert f"{summary} is damaged (not a JSON object: " in run(old)
  summary.write_text(json.dumps({"documents": 3}))
  line = run(old)
  assert f"--convert={old}: its summary.json lacks 'num_shards'" in line, line
  names = ["docs-00000-of-00002.tfrecord", "docs-00001-of-00002.tfrecord"]
  summary.write_text(json.dumps({"documents": 3, "num_shards": 2, "files": names,
                                 "shard_documents": [2, 1], "vocab": {"vocab_size": 9}}))
  (old / names[0]).write_bytes(b"not a TFRecord file at all")
  line = run(old)
  assert f"--convert={old}: {old / names[1]} is missing" in line, line
  (old / names[1]).write_bytes(b"")
  line = run(old)
  assert f"{old / names[0]} is damaged" in line, line
  line = testing.refusal(prepare.main, ["prepare", f"--convert={old}", f"--output_dir={old}"])
  assert "--output_dir must differ from --convert" in line, line
  assert not new.exists() or not list(new.iterdir())


def _is_mapped(array) -> bool:
  """Whether the array's memory is a file mapping (not a copy in memory)."""
  while array is not None and not isinstance(array, mmap.mmap):
    array = getattr(array, "base", None)
  return array is not None


def test_prepared_arrays_are_memory_mapped_and_sized_to_the_vocabulary(books, tmp_path):
  out = str(tmp_path / "p")
  prepare.prepare_corpus(books["glob"], books["vocab"], out, num_shards=2, num_workers=1,
                         progress=False)
  corpus = documents.load_documents(out, nsp=False)
  assert _is_mapped(corpus["tokens"]) and corpus["tokens"].dtype == np.uint16
  assert _is_mapped(corpus["sent_start"]) and not _is_mapped(corpus["doc_first"])
  assert sorted(os.listdir(out)) == sorted([*store.FILES, prepare.SUMMARY_NAME])
  assert store.token_dtype(65536) == np.uint16 and store.token_dtype(65537) == np.uint32
  # A file cut short (or from another run) is named, not read as garbage.
  tokens = os.path.join(out, store.TOKENS)
  with open(tokens, "r+b") as f:
    f.truncate(os.path.getsize(tokens) - 2)
  with pytest.raises(ValueError, match=r"tokens\.npy is damaged or incomplete.*Run prepare"):
    documents.load_documents(out, nsp=False)


class _Planted:
  """Unpickling this object creates the directory `marker`: a load that unpickles shows."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.makedirs, (self.marker,))


@pytest.mark.parametrize("damage", ["cut short", "pickled objects"])
def test_a_damaged_tokens_file_is_one_line_and_never_unpickled(tmp_path, damage):
  """A prepared corpus whose tokens.npy is cut short or holds a pickled object array: one
  line naming the file and what to do, exit 2, from the tools and the job's iterator; the
  objects are never unpickled (issue 56 item 10)."""
  corpus = testing.make_tagged_corpus(str(tmp_path / "c"), num_docs=6, num_shards=2)
  tokens = os.path.join(corpus["prepared"], store.TOKENS)
  marker = str(tmp_path / "unpickled")
  if damage == "cut short":
    with open(tokens, "r+b") as f:
      f.truncate(os.path.getsize(tokens) - 2)
  else:
    np.save(tokens, np.array([1, _Planted(marker)], dtype=object), allow_pickle=True)
  line = testing.refusal(inspect_lib.main, ["inspect", f"--prepared_dir={corpus['prepared']}",
                                            "--num_batches=1", "--max_seq_length=32"])
  assert f"{tokens} is damaged or incomplete (" in line and "Run prepare again" in line, line
  cfg = data_config.default_data_config()
  cfg.prepared_dir, cfg.vocab_path, cfg.eval_fraction = corpus["prepared"], corpus["vocab"], 0.2
  line = testing.refusal(lambda argv: pretrain.PretrainIterator(cfg, batch_size=4, seed=0),
                         ["main.py"])
  assert f"{tokens} is damaged or incomplete (" in line, line
  assert not os.path.exists(marker)


def test_a_summary_that_is_not_json_is_one_line(tmp_path):
  """A prepared directory whose summary.json does not parse (cut short, or another file
  under that name): one line naming it, exit 2 (issue 56 item 10)."""
  (tmp_path / prepare.SUMMARY_NAME).write_text('{"documents": 3, "tok')
  line = testing.refusal(inspect_lib.main, ["inspect", f"--prepared_dir={tmp_path}"])
  assert f"{tmp_path}/summary.json is damaged (not a JSON object: " in line, line
  assert "Run prepare again" in line, line


def test_prepare_errors(books, tmp_path):
  with pytest.raises(FileNotFoundError, match="matches no files"):
    prepare.prepare_corpus(str(tmp_path / "none*.txt"), books["vocab"], str(tmp_path / "o"))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n")
  with pytest.raises(ValueError, match="empty"):
    prepare.prepare_corpus(str(empty), books["vocab"], str(tmp_path / "o"), progress=False)
  with pytest.raises(FileNotFoundError, match="not .*prepared corpus"):
    prepare.load_summary(str(tmp_path / "o"))
  bad_vocab = testing.write_vocab(str(tmp_path / "bad.txt"), ["a"], specials=False)
  with pytest.raises(ValueError, match="lacks the special tokens"):
    prepare.prepare_corpus(books["glob"], bad_vocab, str(tmp_path / "o"))


def test_missing_paths_and_directories_for_files_are_one_line(books, tmp_path):
  """prepare given a missing input, a directory where a file is expected (an input, the
  vocabulary's file) or a file where its output directory goes: one line naming the path
  and what to do, exit 2, nothing written (issue 56 item 10)."""
  run = lambda *flags: testing.refusal(prepare.main, ["prepare", *flags])
  vocab, out = f"--vocab={books['vocab']}", f"--output_dir={tmp_path / 'out'}"
  missing = tmp_path / "nope.txt"
  line = run(f"--input={missing}", vocab, out)
  assert f"Input pattern '{missing}' matches no files. Check the path" in line, line
  plain = tmp_path / "plain"
  plain.mkdir()
  (plain / "a.txt").write_text("Some text.\n")
  line = run(f"--input={plain}", vocab, out)
  assert f"{plain} is a directory" in line, line
  assert f"give the files in it, e.g. '{plain}/*.txt'" in line, line
  line = run(f"--input={tmp_path}/pl*", vocab, out)
  assert f"'{tmp_path}/pl*' matches directories only ({plain})" in line, line
  vocab_dir = tmp_path / "v"
  (vocab_dir / "vocab.txt").mkdir(parents=True)
  line = run(f"--input={books['glob']}", f"--vocab={vocab_dir}", out)
  assert f"No vocabulary at '{vocab_dir}'" in line, line
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  for output in (a_file, a_file / "sub"):
    line = run(f"--input={books['glob']}", vocab, f"--output_dir={output}")
    assert f"The output directory {output} cannot be created: {a_file} is a file" in line
  # Refused after the directory's lock was taken, too: no empty --output_dir left behind.
  assert not (tmp_path / "out").exists() and a_file.read_text() == "x"


def test_prepare_refuses_binary_input_and_logs_replaced_bytes(books, tmp_path, caplog):
  """A binary corpus file fails prepare with an error naming it (no summary.json: the
  output is incomplete); the replaced bytes of the accepted books are logged."""
  binary = books["root"] / "book9.txt"  # Matched by the books' glob.
  binary.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, np.uint8).tobytes())
  out = tmp_path / "out"
  with pytest.raises(text.TooManyReplacedBytesError, match=r"book9\.txt: [\d,]+ of 50,000 "
                     r"bytes read \(\d+\.\d%\) are not valid UTF-8.*--max_replaced_fraction"):
    prepare.main(["prepare", f"--input={books['glob']}", f"--vocab={books['vocab']}",
                  f"--output_dir={out}", "--num_workers=1"])
  assert not out.exists()  # the directory the refused run made is gone (it was empty)
  out.mkdir()
  (out / "notes.txt").write_text("mine")  # a directory the user made is kept as it was
  with pytest.raises(text.TooManyReplacedBytesError):
    prepare.main(["prepare", f"--input={books['glob']}", f"--vocab={books['vocab']}",
                  f"--output_dir={out}", "--num_workers=1"])
  assert [p.name for p in out.iterdir()] == ["notes.txt"]
  binary.unlink()
  caplog.clear()
  with caplog.at_level("INFO"):
    summary = prepare.prepare_corpus(books["glob"], books["vocab"], str(out), num_workers=1,
                                     progress=False)
  assert summary["replaced_bytes"] == 6
  logged = [r.getMessage() for r in caplog.records]
  assert any(f"Prepared {out}" in m and "6 bytes not valid UTF-8" in m for m in logged), logged
  assert sum("book" in m and "1 of" in m and "not valid UTF-8" in m for m in logged) == 6, logged


def test_prepare_default_corpus(tmp_path):
  texts = testing.tagged_words(1, 1)  # Any vocab with specials works: words become [UNK].
  vocab = testing.write_vocab(str(tmp_path / "vocab.txt"), texts + list("abcdefghij"))
  summary = prepare.prepare_corpus("default", vocab, str(tmp_path / "p"), num_shards=2,
                                   num_workers=1, progress=False)
  assert summary["documents"] > 300 and summary["tokens"] > 100_000
  assert summary["input_bytes"] > 1_000_000


def test_encode_document_matches_tf_example():
  sentences = [[5, 127, 128], [300_000, 2**40], [0]]
  raw = records.encode_document(sentences)
  parsed = tf.io.parse_single_example(raw, {
      "token_ids": tf.io.VarLenFeature(tf.int64),
      "sentence_lengths": tf.io.VarLenFeature(tf.int64)})
  assert tf.sparse.to_dense(parsed["token_ids"]).numpy().tolist() == [5, 127, 128, 300_000,
                                                                      2**40, 0]
  assert tf.sparse.to_dense(parsed["sentence_lengths"]).numpy().tolist() == [3, 2, 1]
  reference = tf.train.Example(features=tf.train.Features(feature={
      k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in
      (("token_ids", [5, 127, 128, 300_000, 2**40, 0]), ("sentence_lengths", [3, 2, 1]))}))
  assert tf.train.Example.FromString(raw) == reference


def _write_bert_records(path, n, seed, max_seq_length=16):
  """Records exactly as google-research/bert create_pretraining_data.py writes them."""
  rng = np.random.default_rng(seed)
  written = []
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(n):
      length = int(rng.integers(5, max_seq_length + 1))
      ids = [2] + list(rng.integers(5, 100, length - 2)) + [3] + [0] * (max_seq_length - length)
      ex = {"input_ids": ids, "input_mask": [1] * length + [0] * (max_seq_length - length),
            "segment_ids": [0] * max_seq_length, "masked_lm_positions": [1, 2, 0, 0],
            "masked_lm_ids": [ids[1], ids[2], 0, 0], "next_sentence_labels": [i % 2]}
      feats = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=list(map(int, v))))
               for k, v in ex.items()}
      feats["masked_lm_weights"] = tf.train.Feature(
          float_list=tf.train.FloatList(value=[1.0, 1.0, 0.0, 0.0]))
      writer.write(tf.train.Example(features=tf.train.Features(feature=feats))
                   .SerializeToString())
      written.append(ex)
  return written


def test_original_bert_records(tmp_path):
  written = _write_bert_records(str(tmp_path / "a.tfrecord"), 30, seed=0)
  written += _write_bert_records(str(tmp_path / "b.tfrecord"), 30, seed=1)
  ds = records.read_bert_tfrecords(str(tmp_path / "*.tfrecord"), max_seq_length=16,
                                   max_predictions_per_seq=4)
  got = list(ds.as_numpy_iterator())
  assert len(got) == 60
  for g, w in zip(got, written):
    assert g["input_ids"].dtype == np.int32 and g["input_ids"].tolist() == w["input_ids"]
    assert g["next_sentence_labels"].shape == () and g["next_sentence_labels"] == w[
        "next_sentence_labels"][0]
    assert g["masked_lm_weights"].dtype == np.float32
    assert g["masked_lm_weights"].tolist() == [1.0, 1.0, 0.0, 0.0]
  # Through the iterator: shuffled, endless, restorable.
  cfg = data_config.default_data_config()
  cfg.tfrecord_pattern = str(tmp_path / "*.tfrecord")
  cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.shuffle_buffer = 16, 4, 20
  it = pretrain.PretrainIterator(cfg, batch_size=7, seed=1)
  stream = [next(it) for _ in range(20)]  # 140 examples: more than two epochs.
  assert set(stream[0]) == set(pretrain.FEATURES)
  first_epoch = np.concatenate([b["input_ids"] for b in stream])[:60]
  assert sorted(map(tuple, first_epoch.tolist())) == sorted(tuple(w["input_ids"]) for w in written)
  resumed = pretrain.PretrainIterator(cfg, batch_size=7, seed=1)
  probe = pretrain.PretrainIterator(cfg, batch_size=7, seed=1)
  for _ in range(11):
    next(probe)
  resumed.set_state(json.loads(json.dumps(probe.get_state())))
  for want in stream[11:15]:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
  hosts = [pretrain.PretrainIterator(cfg, batch_size=10, seed=1, process_index=h,
                                     process_count=2) for h in range(2)]
  firsts = [set(map(tuple, np.concatenate([next(h)["input_ids"] for _ in range(3)]).tolist()))
            for h in hosts]
  assert not firsts[0] & firsts[1]


# --------------------------------------------------------------------------- faults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _book(root, megabytes: int = 20) -> str:
  """One book-sized document (free text: the whole file is one document, one task for one
  worker) that keeps a prepare worker busy for seconds: its words are almost all distinct
  (a tagged word with a random tail), so no tokenizer cache makes them cheap."""
  rng = np.random.default_rng(0)
  words = np.array(testing.tagged_words(50, 20))
  lines = round(megabytes * 1e6 / 200)  # ~200 bytes a line
  tails = rng.integers(0, 26, (lines, 20, 3)).astype(np.uint8) + ord("a")
  tails = tails.reshape(-1).view("S3").astype(str).reshape(lines, 20)
  text = np.char.add(words[rng.integers(0, len(words), (lines, 20))], tails)
  out = []
  for k, row in enumerate(text):
    out.append(" ".join(row[:10]) + " and " + " ".join(row[10:]) + (". then" if k % 2 else ""))
    if k % 20 == 19:
      out.append("")
  path = root / "book.txt"
  path.write_text("\n".join(out) + "\n", encoding="utf-8")
  return str(path)


def _children(pid: int) -> set[int]:
  """Process ids whose parent is `pid` (Linux /proc)."""
  found = set()
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[1]) == pid:
      found.add(int(stat.parent.name))
  return found


def _alive(pid: int) -> bool:
  try:
    state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z"  # A zombie has ended; only its exit status is left.


def _start_prepare(root, corpus_file, vocab):
  args = [sys.executable, "-m", "input_pipeline.prepare", f"--input={corpus_file}",
          f"--vocab={vocab}", f"--output_dir={root / 'prepared'}", "--num_shards=2",
          "--num_workers=2"]
  # Output to a file, not a pipe: the workers inherit the pipe, and reading it to its end
  # would wait for them.
  with open(root / "prepare.log", "wb") as log:
    return subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def _cmdline(pid: int) -> str:
  try:
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
  except OSError:
    return ""


def _cpu_seconds(pid: int) -> float:
  try:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  except OSError:
    return 0.0
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_for_busy_workers(proc, count: int = 2) -> set[int]:
  """The pool workers of a running prepare, once one of them is tokenizing the book."""
  deadline = time.time() + 120
  workers = set()
  while len(workers) < count:
    assert proc.poll() is None and time.time() < deadline, "prepare's workers did not start"
    workers = {c for c in _children(proc.pid) if "spawn_main" in _cmdline(c)}
    time.sleep(0.05)
  time.sleep(1.0)  # Their imports.
  before = {w: _cpu_seconds(w) for w in workers}
  # Past receiving the task (fast), into tokenizing it (seconds).
  while not any(_cpu_seconds(w) - before[w] > 1.0 for w in workers):
    assert proc.poll() is None and time.time() < deadline, "no worker got to work"
    time.sleep(0.1)
  return workers


@pytest.fixture
def big(tmp_path):
  vocab = testing.write_vocab(str(tmp_path / "vocab.txt"),
                              testing.tagged_words(50, 20) + ["and", "then"])
  return tmp_path, _book(tmp_path), vocab


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_prepare_killed_leaves_no_workers(big, sig):
  """Killing prepare (SIGKILL or SIGTERM) ends its worker processes at once; SIGTERM
  ends it with a message, not silently with status -15."""
  root, corpus_file, vocab = big
  proc = _start_prepare(root, corpus_file, vocab)
  workers = set()
  try:
    workers = _wait_for_busy_workers(proc)
    proc.send_signal(sig)
    deadline = time.time() + 2  # The book keeps a worker busy for longer.
    proc.wait(timeout=60)
    while time.time() < deadline and any(_alive(w) for w in workers):
      time.sleep(0.05)
    left = [w for w in workers if _alive(w)]
    assert not left, f"workers {left} still running 2 s after {sig.name}"
  finally:
    for w in workers:
      if _alive(w):
        os.kill(w, signal.SIGKILL)
    if proc.poll() is None:
      proc.kill()
  assert not (root / "prepared" / prepare.SUMMARY_NAME).exists()
  stderr = (root / "prepare.log").read_text(errors="replace")
  if sig == signal.SIGTERM:
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, stderr[-3000:])
    assert "stopped by SIGTERM" in stderr and "incomplete" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]


_HOLD_PREPARED = """
import sys, time
from common import dirlock
owner = dirlock.Owner(f"--output_dir={sys.argv[1]}", "", "")
with dirlock.hold(sys.argv[1], owner):
  print("held", flush=True)
  time.sleep(600)
"""


def test_a_second_writer_of_a_prepared_directory_is_one_line(books):
  """prepare (or a training job's build step) writing a prepared directory that another
  live writer holds is refused in one line, exit 2, the holder's output untouched (issue 35
  item 5); a killed writer's lock is taken over, and the lock is gone when prepare ends."""
  out = books["root"] / "prepared"
  holder = subprocess.Popen([sys.executable, "-c", _HOLD_PREPARED, str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    (out / "tokens.npy").write_bytes(b"being written")
    proc = subprocess.run(
        [sys.executable, "-m", "input_pipeline.prepare", f"--input={books['glob']}",
         f"--vocab={books['vocab']}", f"--output_dir={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"prepare.py: error: the prepared corpus {out} is in use by process {holder.pid} on "
        "host"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert (out / "tokens.npy").read_bytes() == b"being written"
    with pytest.raises(prepare.dirlock.LockedError, match="in use by process"):
      prepare.prepare_corpus(books["glob"], books["vocab"], str(out), num_workers=1,
                             progress=False)
  finally:
    holder.kill()
    holder.wait()
  summary = prepare.prepare_corpus(books["glob"], books["vocab"], str(out), num_workers=1,
                                   progress=False)
  assert summary["documents"] == 6 and not (out / "LOCK").exists()


def test_a_corpus_without_text_is_one_line(books, tmp_path):
  """An empty (or blank) corpus file: prepare and the vocabulary's training refuse it in one
  line naming the input, exit 2 (a ValueError traceback before)."""
  from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  blank = tmp_path / "blank.txt"
  blank.write_text("\n   \n\n")
  line = testing.refusal(prepare.main, ["prepare", f"--input={blank}",
                                        f"--vocab={books['vocab']}",
                                        f"--output_dir={tmp_path / 'out'}"])
  assert str(blank) in line and "no text" in line, line
  assert not (tmp_path / "out").exists()
  line = testing.refusal(vocab_lib.main, ["vocab", f"--input={blank}", "--vocab_size=120",
                                          f"--output={tmp_path / 'v'}"])
  assert str(blank) in line and "no text" in line, line


@pytest.mark.parametrize("flag", ["--num_shards=0", "--max_bad_records=-1"])
def test_impossible_counts_are_one_line_before_anything_is_made(books, tmp_path, flag):
  """--num_shards below 1 or --max_bad_records below 0: one line naming the flag, exit 2,
  and no output directory made (a ValueError traceback after the directory was made)."""
  line = testing.refusal(prepare.main, ["prepare", f"--input={books['glob']}",
                                        f"--vocab={books['vocab']}",
                                        f"--output_dir={tmp_path / 'out'}", flag])
  assert line.split(": error: ", 1)[1].startswith(flag.split("=")[0]), line
  assert not (tmp_path / "out").exists()
