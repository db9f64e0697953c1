r"""Trains a BERT vocabulary: WordPiece (vocab.txt) or SentencePiece (spm.model).

  python -m input_pipeline.vocab --input='data/*.txt' --output=/tmp/vocab \
      --vocab_size=30522 [--kind=wordpiece|sentencepiece] [--nolowercase]

--input is a corpus spec (file globs, "default", "tfds:NAME"; see corpus.py). The output
directory gets the vocabulary plus tokenizer_config.json (kind, lowercase), which
`Tokenizer.from_path(DIR)` reads. Special tokens: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
[MASK]=4 in both kinds (SentencePiece: [PAD]/[UNK] as pad/unk pieces, the others as control
symbols, which text never produces).
"""
import os
import sys
import tempfile
import time

from absl import flags
from absl import logging
from etils import epath

from input_pipeline import corpus
from input_pipeline import tokenizer as tokenizer_lib

KINDS = ("wordpiece", "sentencepiece")


def train_vocab(input_spec: str, output_dir: str, *, vocab_size: int = 30522,
                kind: str = "wordpiece", lowercase: bool = True, fmt: str = "auto",
                text_field: str = "text", tfds_data_dir: str | None = None,
                max_chars: int | None = None, min_frequency: int = 2) -> str:
  """Trains a vocabulary on (up to max_chars characters of) a corpus; returns its path."""
  if kind not in KINDS:
    raise ValueError(f"Unknown vocabulary kind {kind!r}; use one of {KINDS}.")
  if vocab_size <= len(tokenizer_lib.SPECIAL_TOKENS):
    raise ValueError(f"vocab_size={vocab_size} leaves no room beyond the special tokens.")
  texts = corpus.iter_texts(input_spec, sentences=kind == "sentencepiece",
                            max_chars=max_chars, fmt=fmt, text_field=text_field,
                            tfds_data_dir=tfds_data_dir)
  start = time.time()
  # The trainers read a local text file (one text per line) in native code, rather than
  # pulling a Python iterator from their own threads. Also: they cannot write to gs://.
  with tempfile.TemporaryDirectory() as tmp:
    text_file = os.path.join(tmp, "texts.txt")
    if not _write_texts(texts, text_file):
      raise ValueError(f"Corpus {input_spec!r} contains no text to train a vocabulary on.")
    out = os.path.join(tmp, "out")
    os.makedirs(out)
    if kind == "wordpiece":
      _train_wordpiece(text_file, out, vocab_size, lowercase, min_frequency)
    else:
      _train_sentencepiece(text_file, out, vocab_size, lowercase)
    tokenizer_lib.write_tokenizer_config(out, kind, lowercase)
    _copy_dir(out, output_dir)
  name = (tokenizer_lib.WORDPIECE_FILE if kind == "wordpiece"
          else tokenizer_lib.SENTENCEPIECE_FILE)
  path = output_dir.rstrip("/") + "/" + name
  tok = tokenizer_lib.Tokenizer.from_path(path)  # Validates the special tokens.
  logging.info("Trained %s vocabulary of %d entries in %.1fs: %s", kind, tok.vocab_size,
               time.time() - start, path)
  return path


def _write_texts(texts, path: str) -> int:
  """Writes texts one per line; returns how many."""
  count = 0
  with open(path, "w", encoding="utf-8") as f:
    for t in texts:
      t = " ".join(t.split())  # Newlines inside a text would split it.
      if t:
        f.write(t + "\n")
        count += 1
  return count


def _train_wordpiece(text_file: str, out_dir: str, vocab_size: int, lowercase: bool,
                     min_frequency: int) -> None:
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top  (only --kind=wordpiece)
  trainer = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True,
                                   strip_accents=None, lowercase=lowercase)
  trainer.train(
      [text_file], vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=1000,
      special_tokens=list(tokenizer_lib.SPECIAL_TOKENS), wordpieces_prefix="##",
      show_progress=False)
  trainer.save_model(out_dir)


def _train_sentencepiece(text_file: str, out_dir: str, vocab_size: int, lowercase: bool) -> None:
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (only --kind=sentencepiece)
  spm.SentencePieceTrainer.train(
      input=text_file,
      model_prefix=os.path.join(out_dir, tokenizer_lib.SENTENCEPIECE_FILE[:-len(".model")]),
      vocab_size=vocab_size, model_type="unigram", character_coverage=0.9995,
      pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      # Case folding inside the model, so the model alone reproduces the tokenization.
      normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
      input_sentence_size=10_000_000, shuffle_input_sentence=True,
      # A soft limit, so that small corpora give a smaller vocabulary instead of failing.
      hard_vocab_limit=False, num_threads=os.cpu_count() or 1, minloglevel=2)


def _copy_dir(src: str, dst: str) -> None:
  """Local scratch dir `src` -> the user's `dst` (local or gs://), file by file."""
  out = epath.Path(dst)
  out.mkdir(parents=True, exist_ok=True)
  for f in sorted(epath.Path(src).iterdir(), key=str):
    (out / f.name).write_bytes(f.read_bytes())


def _flag_values() -> flags.FlagValues:
  # Private FlagValues: importing this module (the training job calls train_vocab) must not
  # add flags that could collide with the importer's.
  fv = flags.FlagValues()
  flags.DEFINE_string("input", None, "Corpus: file globs, 'default' or 'tfds:NAME'.",
                      flag_values=fv)
  flags.DEFINE_string("output", None, "Output directory.", flag_values=fv)
  flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size.", flag_values=fv)
  flags.DEFINE_enum("kind", "wordpiece", KINDS, "Vocabulary kind.", flag_values=fv)
  flags.DEFINE_boolean("lowercase", True, "Uncased (lower-case, strip accents).",
                       flag_values=fv)
  flags.DEFINE_enum("format", "auto", ["auto", "lines", "paragraphs"],
                    "Text file format (see input_pipeline/text.py).", flag_values=fv)
  flags.DEFINE_string("text_field", "text", "TFDS feature holding the text.", flag_values=fv)
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir.", flag_values=fv)
  flags.DEFINE_integer("max_chars", None, "Train on at most this much text.", flag_values=fv)
  return fv


def main(argv: list[str]) -> str:
  fv = _flag_values()
  fv(argv)
  if not fv.input or not fv.output:
    raise SystemExit("--input and --output are required.")
  path = train_vocab(fv.input, fv.output, vocab_size=fv.vocab_size, kind=fv.kind,
                     lowercase=fv.lowercase, fmt=fv.format, text_field=fv.text_field,
                     tfds_data_dir=fv.tfds_data_dir, max_chars=fv.max_chars)
  print(f"Wrote {path}")
  return path


if __name__ == "__main__":
  main(sys.argv)
