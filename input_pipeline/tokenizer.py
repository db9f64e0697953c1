"""BERT tokenization: WordPiece (Rust `tokenizers`) or SentencePiece, behind one small class.

WordPiece is BERT's basic tokenizer (clean control characters, split on whitespace and
punctuation, spaces around CJK characters, lower-case and strip accents when uncased)
followed by greedy longest-match-first WordPiece with "##" continuation pieces and [UNK]
for words over 100 characters. It is token-for-token identical to
`transformers.BertTokenizer` (fast) and to the original Python implementation, for text
that does not spell out special tokens: "[MASK]" written in the text is tokenized as
"[", "mask", "]" (as google-research/bert does), never as the [MASK] token.

This module imports no TensorFlow (the prepare workers use it), except to read gs:// paths.
"""
import hashlib
import json
import os

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONFIG_NAME = "tokenizer_config.json"
WORDPIECE_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "spm.model"
_WORD_START = "\u2581"  # SentencePiece's word-start marker "▁".


def read_bytes(path: str) -> bytes:
  if "://" in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def _exists(path: str) -> bool:
  if "://" in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def resolve_vocab_path(path: str) -> tuple[str, str]:
  """A vocab path (a vocab.txt, a .model, or a directory holding one) -> (kind, file)."""
  path = os.fspath(path)
  for name, kind in ((WORDPIECE_FILE, "wordpiece"), (SENTENCEPIECE_FILE, "sentencepiece")):
    candidate = path.rstrip("/") + "/" + name
    if _exists(candidate):
      return kind, candidate
  if path.endswith(".model") and _exists(path):
    return "sentencepiece", path
  if _exists(path) and not os.path.isdir(path):
    return "wordpiece", path
  raise FileNotFoundError(
      f"No vocabulary at {path!r}: expected a WordPiece vocab.txt, a SentencePiece .model, "
      "or a directory holding one. Train one with `python -m input_pipeline.vocab "
      "--input=... --output=DIR --vocab_size=N`.")


def _sidecar_config(vocab_file: str) -> dict:
  config_file = os.path.join(os.path.dirname(vocab_file), CONFIG_NAME)
  if not _exists(config_file):
    return {}
  return json.loads(read_bytes(config_file))


def _missing_special_error(path: str, missing: list[str]) -> ValueError:
  return ValueError(
      f"Vocabulary {path!r} lacks the special tokens {missing}; BERT needs all of "
      f"{list(SPECIAL_TOKENS)}. Train a vocabulary with `python -m input_pipeline.vocab` "
      "(it adds them) or add them to the file.")


class Tokenizer:
  """Text <-> ids with BERT's special tokens and a whole-word table.

  Attributes: kind ("wordpiece" | "sentencepiece"), path, lowercase, sha256 (of the
  vocab file), tokens (id -> string), vocab_size, pad_id unk_id cls_id sep_id mask_id,
  is_continuation (bool [V]: the token continues the previous token's word, i.e. starts
  with "##" in WordPiece / lacks "▁" in SentencePiece), is_special (bool [V]: the five
  special tokens and "[unusedN]" placeholders, never masked or drawn as random tokens).
  """

  def __init__(self, kind: str, path: str, lowercase: bool, tokens: list[str], backend,
               sha256: str):
    self.kind, self.path, self.lowercase = kind, path, lowercase
    self.tokens, self._backend, self.sha256 = tokens, backend, sha256
    self._ids = {t: i for i, t in enumerate(tokens)}
    missing = [t for t in SPECIAL_TOKENS if t not in self._ids]
    if missing:
      raise _missing_special_error(path, missing)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self._ids[t] for t in SPECIAL_TOKENS)
    self.vocab_size = len(tokens)
    self.is_special = np.array(
        [t in SPECIAL_TOKENS or (t.startswith("[unused") and t.endswith("]"))
         for t in tokens], dtype=bool)
    if kind == "wordpiece":
      cont = [t.startswith("##") for t in tokens]
    else:
      cont = [bool(t) and not t.startswith(_WORD_START) for t in tokens]
    self.is_continuation = np.array(cont, dtype=bool) & ~self.is_special

  @classmethod
  def from_path(cls, path: str, lowercase: bool | None = None) -> "Tokenizer":
    """Loads a WordPiece vocab.txt or SentencePiece model (file or directory).

    lowercase=None takes the value saved beside the vocab by `input_pipeline.vocab`, else
    (WordPiece) lower-cases when no vocab entry has an upper-case letter, else (SentencePiece)
    leaves normalization to the model.
    """
    kind, vocab_file = resolve_vocab_path(path)
    data = read_bytes(vocab_file)
    sha256 = hashlib.sha256(data).hexdigest()
    if lowercase is None:
      lowercase = _sidecar_config(vocab_file).get("lowercase")
    if kind == "wordpiece":
      # As transformers' load_vocab: one token per line, only "\n" stripped.
      tokens = data.decode("utf-8").split("\n")
      if tokens and tokens[-1] == "":
        tokens.pop()
      if lowercase is None:
        lowercase = not any(c.isupper() for t in tokens if t not in SPECIAL_TOKENS for c in t)
      backend = _wordpiece_backend(tokens, lowercase, vocab_file)
    else:
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top
      backend = spm.SentencePieceProcessor(model_proto=data)
      tokens = [backend.id_to_piece(i) for i in range(backend.get_piece_size())]
      lowercase = bool(lowercase)
    return cls(kind, vocab_file, lowercase, tokens, backend, sha256)

  def encode(self, text: str) -> list[int]:
    """Token ids of one text, without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    if self.kind == "wordpiece":
      return [e.ids for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]
    if self.lowercase:
      texts = [t.lower() for t in texts]
    return self._backend.encode(list(texts), out_type=int)

  def convert_ids_to_tokens(self, ids) -> list[str]:
    return [self.tokens[int(i)] for i in ids]

  def convert_tokens_to_ids(self, tokens) -> list[int]:
    return [self._ids.get(t, self.unk_id) for t in tokens]

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.kind == "wordpiece":
      return self._backend.decode(ids, skip_special_tokens=False)
    return self._backend.decode(ids)


def _wordpiece_backend(tokens: list[str], lowercase: bool, vocab_file: str):
  from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers
  vocab = {t: i for i, t in enumerate(tokens)}
  missing = [t for t in SPECIAL_TOKENS if t not in vocab]
  if missing:
    raise _missing_special_error(vocab_file, missing)
  backend = RustTokenizer(models.WordPiece(
      vocab, unk_token="[UNK]", max_input_chars_per_word=100, continuing_subword_prefix="##"))
  # strip_accents=None: strip exactly when lower-casing, as the original BERT.
  backend.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  backend.decoder = decoders.WordPiece(prefix="##")
  return backend


def write_tokenizer_config(directory: str, kind: str, lowercase: bool) -> None:
  with open(os.path.join(directory, CONFIG_NAME), "w") as f:
    json.dump({"kind": kind, "lowercase": lowercase}, f, indent=2)
