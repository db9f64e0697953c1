r"""Trains a BERT vocabulary: WordPiece (vocab.txt), SentencePiece (spm.model) or byte-level
BPE (tokenizer.json).

  python -m input_pipeline.vocab --input='data/*.txt' --output=/tmp/vocab \
      --vocab_size=30522 [--kind=wordpiece|sentencepiece|bpe] [--[no]lowercase]

--input is a corpus spec (file globs, "default", "tfds:NAME"; see corpus.py). The output
directory gets the vocabulary plus tokenizer_config.json (kind, lowercase), which
`Tokenizer.from_path(DIR)` reads. Special tokens: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
[MASK]=4 in every kind (SentencePiece: [PAD]/[UNK] as pad/unk pieces, the others as control
symbols, which text never produces). Each model family trains the kind of its published
vocabularies (bert_jax/families.py `vocab_kind`): WordPiece for BERT and ELECTRA,
SentencePiece for XLM-R and DeBERTa-v3, byte-level BPE (RoBERTa's and ModernBERT's: any byte
sequence, so no [UNK]) as a tokenizer.json with BERT's pair template `[CLS] A [SEP] B [SEP]`.

The same corpus and flags give a byte-identical vocabulary. Training keeps its files in
OUTPUT.scratch (removed at the end, and by the next run after a kill). A corpus file with
more than --max_replaced_fraction (default 1%) of bytes that are not UTF-8 is refused.
"""
import collections
import hashlib
import os
import tempfile
import time
import unicodedata

from absl import flags
from absl import logging

from common import errors
from common import fileio
from input_pipeline import corpus
from input_pipeline import text as text_lib
from input_pipeline import tokenizer as tokenizer_lib

KINDS = ("wordpiece", "sentencepiece", "bpe")
BYTES = 256  # a byte-level BPE's alphabet
# The most frequent characters that WordPiece keeps as its alphabet (tokenizers' default).
ALPHABET_LIMIT = 1000
_TEXTS_NAME = "texts.txt"
# kind -> the vocabulary file it writes.
FILES = {"wordpiece": tokenizer_lib.WORDPIECE_FILE,
         "sentencepiece": tokenizer_lib.SENTENCEPIECE_FILE,
         "bpe": tokenizer_lib.HF_TOKENIZER_FILE}
# SentencePiece's threads: fixed, as its result depends on their number.
_SENTENCEPIECE_THREADS = 16


def default_lowercase(kind: str) -> bool:
  """The casing a `kind` of vocabulary is trained with unless asked otherwise: uncased
  WordPiece and SentencePiece (BERT-base-uncased's casing), cased byte-level BPE (as every
  published one: RoBERTa's, ModernBERT's)."""
  return kind != "bpe"


def scratch_dir(output_dir: str) -> str:
  """Where training keeps its files (a copy of the training text, the raw output).

  Beside a local output (`OUTPUT.scratch`), so that nothing of the corpus lands in the
  system's temporary directory; for a gs:// output (the trainers read and write local
  files only) a directory of the system's temporary directory named after the output.
  Either way a run removes the scratch directory when it ends, and one left by a killed
  run is removed by the next run for the same output.
  """
  output_dir = output_dir.rstrip("/")
  if not fileio.is_remote(output_dir):
    return output_dir + ".scratch"
  digest = hashlib.sha256(output_dir.encode("utf-8")).hexdigest()[:16]
  return os.path.join(tempfile.gettempdir(), f"input_pipeline_vocab-{digest}")


def train_vocab(input_spec: str, output_dir: str, *, vocab_size: int = 30522,
                kind: str = "wordpiece", lowercase: bool | None = None, fmt: str = "auto",
                text_field: str = "text", tfds_data_dir: str | None = None,
                max_chars: int | None = None, min_frequency: int = 2,
                max_replaced_fraction: float = text_lib.MAX_REPLACED_FRACTION,
                max_bad_records: int = 0) -> str:
  """Trains a vocabulary on (up to max_chars characters of) a corpus; returns its path.

  The same corpus and settings give a byte-identical vocabulary, whatever the number of
  threads. A corpus file with more than max_replaced_fraction undecodable bytes is
  refused (text.TooManyReplacedBytesError). `lowercase` None: default_lowercase(kind).
  """
  _check_request(kind, vocab_size, output_dir)
  lowercase = default_lowercase(kind) if lowercase is None else lowercase
  stats = corpus.new_stats()
  texts = corpus.iter_texts(input_spec, sentences=kind == "sentencepiece",
                            max_chars=max_chars, fmt=fmt, text_field=text_field,
                            tfds_data_dir=tfds_data_dir, stats=stats,
                            max_replaced_fraction=max_replaced_fraction,
                            max_bad_records=max_bad_records)
  start = time.time()
  # The trainers read a local text file (one text per line) in native code, rather than
  # pulling a Python iterator from their own threads. Also: they cannot write to gs://.
  scratch = fileio.path(scratch_dir(output_dir))
  if scratch.exists():
    logging.info("Removing %s, left by an interrupted run.", scratch)
    scratch.rmtree()
  scratch.mkdir(parents=True)
  try:
    text_file = scratch / _TEXTS_NAME
    alphabet = _Alphabet(lowercase) if kind == "wordpiece" else None
    if not _write_texts(texts, text_file, alphabet):
      raise errors.EmptyCorpusError(
          f"Corpus {input_spec!r} holds no text to train a vocabulary on. Check the files "
          "(--input), and for records their --text_field.")
    logging.info("Training a %s vocabulary on %r: %s.", kind, input_spec,
                 corpus.format_stats(stats))
    out = scratch / "out"
    out.mkdir()
    if kind == "wordpiece":
      _train_wordpiece(str(text_file), str(out), vocab_size, lowercase, min_frequency,
                       alphabet)
    elif kind == "bpe":
      _train_bpe(str(text_file), str(out), vocab_size, lowercase, min_frequency)
    else:
      _train_sentencepiece(str(text_file), str(out), vocab_size, lowercase)
    entries = _check_special_tokens(out, kind)
    tokenizer_lib.write_tokenizer_config(str(out), kind, lowercase)
    _copy_dir(out, output_dir)
  finally:
    scratch.rmtree(missing_ok=True)
  name = FILES[kind]
  logging.info("Trained a %s vocabulary of %d entries in %.1fs.", kind, entries,
               time.time() - start)
  return output_dir.rstrip("/") + "/" + name


def _check_request(kind: str, vocab_size: int, output_dir: str) -> None:
  """Refuses, before any reading, what train_vocab cannot do."""
  if kind not in KINDS:
    raise errors.ConfigError(f"Unknown vocabulary kind {kind!r}; use one of {KINDS}.")
  specials = len(tokenizer_lib.SPECIAL_TOKENS)
  if vocab_size <= specials:
    raise errors.ConfigError(
        f"--vocab_size={vocab_size} leaves no room beyond the {specials} special tokens: ask "
        f"for at least {specials + 1} (BERT's has 30522 entries).")
  if kind == "bpe" and vocab_size <= BYTES + specials:
    raise errors.ConfigError(
        f"--vocab_size={vocab_size} leaves no room for merges: a byte-level BPE holds the "
        f"{BYTES} bytes and the {specials} special tokens first; ask for at least "
        f"{BYTES + specials + 1} (RoBERTa's has 50265 entries).")
  fileio.check_output_dir(output_dir)


def _write_texts(texts, path, alphabet: "_Alphabet | None") -> int:
  """Writes texts one per line (counting their characters into `alphabet`); returns how
  many."""
  count = 0
  with path.open("w", encoding="utf-8") as f:
    for t in texts:
      t = " ".join(t.split())  # Newlines inside a text would split it.
      if t:
        f.write(t + "\n")
        if alphabet is not None:
          alphabet.add(t)
        count += 1
  return count


# BERT's CJK ranges: the normalizer puts spaces around these, so they never continue a word.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _can_continue(char: str) -> bool:
  """Whether BERT's pre-tokenizer may put `char` inside a word: not punctuation (ASCII
  punctuation or Unicode category P*, split off as words of their own), not CJK."""
  cp = ord(char)
  if char.isascii() and not char.isalnum():
    return False
  if unicodedata.category(char).startswith("P"):
    return False
  return not any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


class _Alphabet:
  """The characters of the training text as the WordPiece trainer sees them (after BERT's
  normalizer), counted."""

  def __init__(self, lowercase: bool):
    from tokenizers import normalizers  # pylint: disable=g-import-not-at-top  (only --kind=wordpiece)
    self._normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    self.counts = collections.Counter()

  def add(self, text: str) -> None:
    self.counts.update(self._normalizer.normalize_str(text))

  def initial_tokens(self, limit: int) -> tuple[list[str], list[str]]:
    """(characters, "##" forms): the `limit` most frequent characters (ties by code
    point) in code point order, and the "##" forms of those that can continue a word."""
    counts = {c: n for c, n in self.counts.items() if not c.isspace()}
    kept = sorted(sorted(counts, key=lambda c: (-counts[c], c))[:limit])
    return kept, ["##" + c for c in kept if _can_continue(c)]


def _train_wordpiece(text_file: str, out_dir: str, vocab_size: int, lowercase: bool,
                     min_frequency: int, alphabet: _Alphabet) -> None:
  """tokenizers' WordPiece trainer, made deterministic.

  The trainer breaks ties between equally frequent merges by token id, and numbers the
  "##" forms of the characters in the order it meets them in a hash map, which changes
  from run to run (huggingface/tokenizers#1794): the same corpus gave another vocabulary
  every time. Here every initial token has a fixed id: the special tokens, then the
  alphabet (`initial_alphabet`, exactly ALPHABET_LIMIT characters at most), then the "##"
  forms, all passed as special tokens in that order; the merges are then the same in
  every run and with any number of threads. Should the trainer still number a "##" form
  itself (a character this module thought could not continue a word), the training is
  repeated with it fixed too.
  """
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top  (only --kind=wordpiece)
  chars, continuing = alphabet.initial_tokens(ALPHABET_LIMIT)
  for _ in range(2):
    initial = list(tokenizer_lib.SPECIAL_TOKENS) + chars + continuing
    trainer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True,
                                     strip_accents=None, lowercase=lowercase)
    trainer.train(
        [text_file], vocab_size=vocab_size, min_frequency=min_frequency,
        limit_alphabet=len(chars), initial_alphabet=chars, special_tokens=initial,
        wordpieces_prefix="##", show_progress=False)
    vocab = sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])
    unplanned = sorted(t for t, _ in vocab[len(initial):]
                       if len(t) == 1 or (t.startswith("##") and len(t) == 3))
    if not unplanned:
      break
    continuing = sorted(set(continuing) | set(unplanned), key=lambda t: (len(t), t))
  trainer.save_model(out_dir)


def _check_special_tokens(out, kind: str) -> int:
  """Checks the trained vocabulary's special tokens; returns its size."""
  if kind == "wordpiece":
    tokens = (out / tokenizer_lib.WORDPIECE_FILE).read_text(encoding="utf-8").split("\n")
    tokens = tokens[:-1] if tokens and not tokens[-1] else tokens
  elif kind == "bpe":
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top  (the Rust backend)
    backend = Tokenizer.from_file(str(out / tokenizer_lib.HF_TOKENIZER_FILE))
    tokens = [backend.id_to_token(i) for i in range(backend.get_vocab_size())]
  else:
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (only --kind=sentencepiece)
    sp = spm.SentencePieceProcessor(model_file=str(out / tokenizer_lib.SENTENCEPIECE_FILE))
    tokens = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  if tuple(tokens[:len(tokenizer_lib.SPECIAL_TOKENS)]) != tokenizer_lib.SPECIAL_TOKENS:
    raise RuntimeError(f"The trained vocabulary starts with {tokens[:5]}, not "
                       f"{list(tokenizer_lib.SPECIAL_TOKENS)}.")
  return len(tokens)


def _train_sentencepiece(text_file: str, out_dir: str, vocab_size: int, lowercase: bool) -> None:
  """SentencePiece's unigram trainer. Its result depends on its number of threads (the
  EM sums are split by thread), hence a fixed number rather than the machine's cores, and
  on its random generator (the sample of a corpus above input_sentence_size), hence a
  fixed seed; the model is rewritten without the scratch paths its trainer_spec records."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (only --kind=sentencepiece)
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top  (only --kind=sentencepiece)
  prefix = os.path.join(out_dir, tokenizer_lib.SENTENCEPIECE_FILE[:-len(".model")])
  spm.set_random_generator_seed(0)
  spm.SentencePieceTrainer.train(
      input=text_file, model_prefix=prefix,
      vocab_size=vocab_size, model_type="unigram", character_coverage=0.9995,
      pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      # Case folding inside the model, so the model alone reproduces the tokenization.
      normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
      input_sentence_size=10_000_000, shuffle_input_sentence=True,
      # A soft limit, so that small corpora give a smaller vocabulary instead of failing.
      hard_vocab_limit=False, num_threads=_SENTENCEPIECE_THREADS, minloglevel=2)
  model = fileio.path(prefix + ".model")
  proto = sentencepiece_model_pb2.ModelProto.FromString(model.read_bytes())
  del proto.trainer_spec.input[:]
  proto.trainer_spec.model_prefix = ""
  model.write_bytes(proto.SerializeToString())


def _train_bpe(text_file: str, out_dir: str, vocab_size: int, lowercase: bool,
               min_frequency: int) -> None:
  """tokenizers' byte-level BPE trainer (as RoBERTa's and GPT-2's: words split by GPT-2's
  pattern, no prefix space, all 256 bytes in the alphabet), lower-casing first (no accent
  stripping) when `lowercase`; the special tokens first, the pair template BERT's, and a
  token's character offsets without the space it starts with (as RoBERTa's: a span read from
  them starts at the word). Its merges are chosen by count, ties by the pair's ids, which
  follow the sorted alphabet: the same corpus gives the same file in every run (test)."""
  import tokenizers  # pylint: disable=g-import-not-at-top  (only --kind=bpe)
  byte_level = tokenizers.pre_tokenizers.ByteLevel
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  if lowercase:
    tok.normalizer = tokenizers.normalizers.Lowercase()
  tok.pre_tokenizer = byte_level(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  tok.train([text_file], tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
      special_tokens=list(tokenizer_lib.SPECIAL_TOKENS), initial_alphabet=byte_level.alphabet()))
  cls, sep = (tokenizer_lib.SPECIAL_TOKENS[i] for i in (2, 3))
  tok.post_processor = tokenizers.processors.Sequence([
      tokenizers.processors.ByteLevel(trim_offsets=True),
      tokenizers.processors.TemplateProcessing(
          single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
          special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])])
  tok.save(os.path.join(out_dir, tokenizer_lib.HF_TOKENIZER_FILE))


def _copy_dir(src, dst: str) -> None:
  """Local scratch dir `src` -> the user's `dst` (local or gs://), file by file."""
  out = fileio.path(dst)
  out.mkdir(parents=True, exist_ok=True)
  for f in sorted(fileio.path(src).iterdir(), key=str):
    (out / f.name).write_bytes(f.read_bytes())


def _flag_values() -> flags.FlagValues:
  # Private FlagValues: importing this module (the training job calls train_vocab) must not
  # add flags that could collide with the importer's.
  fv = flags.FlagValues()
  flags.DEFINE_string("input", None, "Corpus: file globs, 'default' or 'tfds:NAME'.",
                      flag_values=fv)
  flags.DEFINE_string("output", None, "Output directory.", flag_values=fv)
  flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size.", flag_values=fv)
  flags.DEFINE_enum("kind", "wordpiece", KINDS, "Vocabulary kind (bpe: byte-level BPE).",
                    flag_values=fv)
  flags.DEFINE_boolean("lowercase", None, "Uncased (lower-case; WordPiece also strips "
                       "accents). Default: uncased WordPiece and SentencePiece, cased bpe.",
                       flag_values=fv)
  corpus.define_flags(fv, "Skip up to this many records without usable text in record "
                      "files; one more is an error.")
  flags.DEFINE_integer("max_chars", None, "Train on at most this much text.", flag_values=fv)
  return fv


def main(argv: list[str]) -> str:
  fv = _flag_values()
  errors.parse_flags(fv, argv, __doc__)
  errors.require_flags(fv, "input", "output")
  path = train_vocab(fv.input, fv.output, vocab_size=fv.vocab_size, kind=fv.kind,
                     lowercase=fv.lowercase, max_chars=fv.max_chars, **corpus.flag_options(fv))
  print(f"Wrote {path}")
  return path


if __name__ == "__main__":
  errors.run_tool(main)
