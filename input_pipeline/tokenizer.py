"""BERT tokenization: WordPiece (Rust `tokenizers`), SentencePiece, or a HuggingFace
`tokenizer.json` (the BPE of ModernBERT, EuroBERT, ...), behind one small class.

WordPiece is BERT's basic tokenizer (clean control characters, split on whitespace and
punctuation, spaces around CJK characters, lower-case and strip accents when uncased)
followed by greedy longest-match-first WordPiece with "##" continuation pieces and [UNK]
for words over 100 characters. It is token-for-token identical to
`transformers.BertTokenizer` (fast) and to the original Python implementation, for text
that does not spell out special tokens: "[MASK]" written in the text is tokenized as
"[", "mask", "]" (as google-research/bert does), never as the [MASK] token.

A `tokenizer.json` (kind "hf", read when a directory holds no vocab.txt or .model) is the
model's own tokenizer, through the same Rust library transformers' fast tokenizers run: its
normalizer, pre-tokenizer and added tokens as saved (special tokens written in the text, such
as "[MASK]", are matched as those tokens, as AutoTokenizer does); the ids of [CLS] / [SEP]
come from its post-processor's pair template, which must be BERT's layout
(`cls A sep B sep`, one token each).

This module imports no TensorFlow (the prepare workers use it), except to read gs:// paths.
"""
import dataclasses
import hashlib
import json
import itertools
import os
import re

from absl import logging
from etils import epath
import numpy as np

from common import errors

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONFIG_NAME = "tokenizer_config.json"
WORDPIECE_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "spm.model"
HF_TOKENIZER_FILE = "tokenizer.json"
_WORD_START = "\u2581"  # SentencePiece's word-start marker "▁".
_BYTE_SPACE = "\u0120"  # byte-level BPE's word-start marker "Ġ" (a space byte).


def read_bytes(path: str) -> bytes:
  return epath.Path(path).read_bytes()


def _exists(path: str) -> bool:
  return epath.Path(path).exists()


class VocabularyNotFoundError(errors.UserError, FileNotFoundError):
  """No vocabulary file at the path given."""


def resolve_vocab_path(path: str) -> tuple[str, str]:
  """A vocab path (a vocab.txt, a .model, or a directory holding one) -> (kind, file)."""
  path = os.fspath(path)
  for name, kind in ((WORDPIECE_FILE, "wordpiece"), (SENTENCEPIECE_FILE, "sentencepiece"),
                     (HF_TOKENIZER_FILE, "hf")):
    candidate = path.rstrip("/") + "/" + name
    if _exists(candidate) and not epath.Path(candidate).is_dir():
      return kind, candidate
  if path.endswith(".model") and _exists(path):
    return "sentencepiece", path
  if path.endswith(".json") and _exists(path):
    return "hf", path
  if _exists(path) and not epath.Path(path).is_dir():
    return "wordpiece", path
  raise VocabularyNotFoundError(
      f"No vocabulary at {path!r}: expected a WordPiece vocab.txt, a SentencePiece .model, "
      "a HuggingFace tokenizer.json, or a directory holding one. Train one with `python -m input_pipeline.vocab "
      "--input=... --output=DIR --vocab_size=N`.")


def _read_json_beside(vocab_file: str, name: str) -> dict:
  path = vocab_file.rsplit("/", 1)[0] + "/" + name if "/" in vocab_file else name
  if not _exists(path):
    return {}
  try:
    data = json.loads(read_bytes(path))
  except ValueError as e:
    raise ValueError(f"{path} is not valid JSON ({e}); fix or remove it.") from e
  return data if isinstance(data, dict) else {}


# Above this share of (non-special) entries with an upper-case letter, a bare vocab.txt
# reads as cased. Letters without a lower-case form ("ℝ", which str.isupper() calls
# upper-case and bert-base-uncased holds) do not count; a cased vocabulary has capitalised
# words in the tens of percent, an uncased one (almost) none.
CASED_SHARE = 0.01


@dataclasses.dataclass(frozen=True)
class Normalization:
  """BERT's basic-tokenizer settings: what `transformers.BertTokenizer` calls
  do_lower_case, strip_accents (None = follow lowercase) and tokenize_chinese_chars."""
  lowercase: bool
  strip_accents: bool | None = None
  tokenize_chinese_chars: bool = True
  reason: str = ""


def _casing_from_vocab(tokens: list[str]) -> tuple[bool, str]:
  words = [t for t in tokens if t not in SPECIAL_TOKENS and not (t.startswith("[") and t.endswith("]"))]
  cased = sum(any(c != c.lower() for c in t) for t in words)
  share = cased / max(len(words), 1)
  lowercase = share <= CASED_SHARE
  return lowercase, (f"no tokenizer_config.json says; {cased} of {len(words)} entries "
                     f"({100 * share:.2f}%) have upper-case letters, "
                     f"{'at most' if lowercase else 'more than'} {100 * CASED_SHARE:g}%: "
                     f"read as {'uncased' if lowercase else 'cased'}")


def wordpiece_normalization(vocab_file: str, tokens: list[str],
                            lowercase: bool | None = None) -> Normalization:
  """How a WordPiece vocabulary's text is normalised, and why.

  In order: an explicit `lowercase`; a HuggingFace tokenizer_config.json beside the vocab
  (do_lower_case, strip_accents, tokenize_chinese_chars: what transformers reads); the
  BertNormalizer of a tokenizer.json beside it; the `lowercase` that
  `input_pipeline.vocab` saved; else the share of vocabulary entries with upper-case letters.
  """
  config = _read_json_beside(vocab_file, CONFIG_NAME)
  if config.get("do_basic_tokenize") is False:
    raise ValueError(
        f"{vocab_file}: tokenizer_config.json sets do_basic_tokenize=false, which bert_jax "
        "does not implement (it always splits punctuation and CJK characters as BERT does).")
  normalizer = _read_json_beside(vocab_file, "tokenizer.json").get("normalizer") or {}
  if normalizer.get("type") != "BertNormalizer":
    normalizer = {}
  strip_accents = config.get("strip_accents", normalizer.get("strip_accents"))
  chinese = config.get("tokenize_chinese_chars", normalizer.get("handle_chinese_chars", True))
  if lowercase is not None:
    reason = "set explicitly"
  elif "do_lower_case" in config:
    lowercase, reason = bool(config["do_lower_case"]), f"do_lower_case in {CONFIG_NAME}"
  elif "lowercase" in normalizer:
    lowercase, reason = bool(normalizer["lowercase"]), "the BertNormalizer of tokenizer.json"
  elif "lowercase" in config:
    lowercase, reason = bool(config["lowercase"]), f"lowercase in {CONFIG_NAME} (input_pipeline.vocab)"
  else:
    lowercase, reason = _casing_from_vocab(tokens)
  return Normalization(bool(lowercase), None if strip_accents is None else bool(strip_accents),
                       bool(chinese), reason)


_LOGGED: set = set()


def _log_once(vocab_file: str, norm: Normalization) -> None:
  key = (vocab_file, norm)
  if key in _LOGGED:
    return
  _LOGGED.add(key)
  accents = {None: "strip accents when lower-casing", True: "strip accents",
             False: "keep accents"}[norm.strip_accents]
  logging.info("Vocabulary %s: %s, %s%s (%s). Override with the `lowercase` option.",
               vocab_file, "uncased (lower-case)" if norm.lowercase else "cased", accents,
               "" if norm.tokenize_chinese_chars else ", CJK characters not split", norm.reason)


def _missing_special_error(path: str, missing: list[str]) -> ValueError:
  return VocabularyError(
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
               sha256: str, normalization: Normalization | None = None,
               special: dict[str, int] | None = None, specials: frozenset = frozenset(),
               pair_seps: int = 1):
    """`special`: the ids of pad, unk, cls, sep and mask (default: BERT's five tokens by
    name); `specials`: every other token never masked or drawn (a tokenizer.json's);
    `pair_seps`: the separators between a pair's segments (BERT 1, RoBERTa 2)."""
    self.pair_seps = pair_seps
    self.kind, self.path, self.lowercase = kind, path, lowercase
    self.normalization = normalization or Normalization(lowercase)
    self.tokens, self._backend, self.sha256 = tokens, backend, sha256
    self._ids = {t: i for i, t in enumerate(tokens)}
    if special is None:
      missing = [t for t in SPECIAL_TOKENS if t not in self._ids]
      if missing:
        raise _missing_special_error(path, missing)
      special = dict(zip(("pad", "unk", "cls", "sep", "mask"),
                         (self._ids[t] for t in SPECIAL_TOKENS)))
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        special[k] for k in ("pad", "unk", "cls", "sep", "mask"))
    self.mask_text = tokens[self.mask_id]  # how a mask is written in predict's input
    self.vocab_size = len(tokens)
    named = {tokens[i] for i in special.values()} | set(specials)
    self.is_special = np.array(
        [t in SPECIAL_TOKENS or t in named or (t.startswith("[unused") and t.endswith("]"))
         for t in tokens], dtype=bool)
    if kind == "wordpiece":
      cont = [t.startswith("##") for t in tokens]
    elif kind == "hf" and any(t.startswith(_BYTE_SPACE) for t in tokens):  # byte-level BPE
      cont = [bool(t) and not t.startswith(_BYTE_SPACE) for t in tokens]
    else:
      cont = [bool(t) and not t.startswith(_WORD_START) for t in tokens]
    self.is_continuation = np.array(cont, dtype=bool) & ~self.is_special
    self._chunks = None  # from_path sets it for WordPiece: see encode_flat.

  @classmethod
  def from_path(cls, path: str, lowercase: bool | None = None) -> "Tokenizer":
    """Loads a WordPiece vocab.txt or SentencePiece model (the file, or a directory holding
    it such as a HuggingFace model directory: both give the same tokenizer).

    lowercase=None: WordPiece text is normalised as the files beside the vocab say (see
    `wordpiece_normalization`; the decision and its reason are logged once); SentencePiece
    takes the `lowercase` saved by `input_pipeline.vocab`, else leaves normalization to
    the model. An explicit `lowercase` overrides both.
    """
    kind, vocab_file = resolve_vocab_path(path)
    data = read_bytes(vocab_file)
    sha256 = hashlib.sha256(data).hexdigest()
    if kind == "wordpiece":
      # As transformers' load_vocab: one token per line, only "\n" stripped.
      try:
        tokens = data.decode("utf-8").split("\n")
      except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise VocabularyError(f"{vocab_file}:{line}: byte {data[e.start:e.start + 1]!r} is not "
                              "UTF-8: a vocab.txt is UTF-8 text, one token per line; use the "
                              "file the model was trained with, or fix that line.") from None
      if tokens and tokens[-1] == "":
        tokens.pop()
      _check_unique(tokens, vocab_file)
      norm = wordpiece_normalization(vocab_file, tokens, lowercase)
      _log_once(vocab_file, norm)
      backend = _wordpiece_backend(tokens, norm, vocab_file)
      tok = cls(kind, vocab_file, norm.lowercase, tokens, backend, sha256, norm)
      tok._chunks = _ChunkTable(tok._ids, tok.unk_id, norm.lowercase, backend)  # pylint: disable=protected-access
      return tok
    elif kind == "hf":
      return _hf_tokenizer(vocab_file, data, sha256)
    else:
      import sentencepiece as spm  # pylint: disable=g-import-not-at-top  (only SentencePiece vocabularies)
      if lowercase is None:
        lowercase = _read_json_beside(vocab_file, CONFIG_NAME).get("lowercase")
      backend = spm.SentencePieceProcessor(model_proto=data)
      tokens = [backend.id_to_piece(i) for i in range(backend.get_piece_size())]
      if "[MASK]" not in tokens and set(SPECIAL_TOKENS) - set(tokens) == {"[MASK]"}:
        # DeBERTa-v3's spm.model holds [PAD] [CLS] [SEP] [UNK]; transformers' tokenizer adds
        # [MASK] after its pieces (id 128000 of 128100 rows), and so do we.
        tokens.append("[MASK]")
      norm = Normalization(bool(lowercase), reason="SentencePiece")
    return cls(kind, vocab_file, norm.lowercase, tokens, backend, sha256, norm)

  def encode(self, text: str) -> list[int]:
    """Token ids of one text, without [CLS]/[SEP]."""
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    if self.kind in ("wordpiece", "hf"):
      return [e.ids for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]
    if self.lowercase:
      texts = [t.lower() for t in texts]
    return self._backend.encode(list(texts), out_type=int)

  def encode_words(self, words: list[str]) -> list[list[int]]:
    """Token ids of each word of a pre-split text (CoNLL's words), as the words are
    tokenized in the running text `" ".join(words)`: every word after the first keeps the
    space before it. WordPiece and SentencePiece mark a word's start themselves; a
    byte-level BPE without a prefix space (ModernBERT, EuroBERT) encodes `the` and ` the`
    as different tokens, and a word encoded alone would get the one never seen mid-text.
    A tokenizer that adds a prefix space (RoBERTa-style files) gives it to the first word
    too, as it does to the start of a text."""
    return self.encode_batch([w if i == 0 else " " + w for i, w in enumerate(words)])

  def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(token ids of all texts concatenated [T] int32, token count of each text [N] int64):
    the ids of `encode_batch(texts)`, flattened.

    A WordPiece vocabulary loaded by `from_path` encodes through a table of the
    space-separated chunks already seen (`_ChunkTable`: the same ids, several times faster
    on prose, where most words repeat); other kinds call `encode_batch`.
    """
    if not texts:
      return np.zeros(0, np.int32), np.zeros(0, np.int64)
    if self._chunks is None:
      ids = self.encode_batch(list(texts))
      lengths = np.fromiter(map(len, ids), np.int64, len(ids))
      return (np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum())),
              lengths)
    return self._chunks.encode_flat(texts)

  def tokenizer_json(self) -> str:
    """A HuggingFace tokenizer.json that tokenizes as this Tokenizer does (what every
    export carries: transformers' fast tokenizers, and AutoTokenizer for any model type,
    load it), with the special tokens matched in text and the template cls A sep B sep."""
    if self.kind == "hf":
      return self._backend.to_str()
    from tokenizers import AddedToken, processors  # pylint: disable=g-import-not-at-top
    if self.kind == "wordpiece":  # a fresh backend: added tokens would change our encoding
      backend = _wordpiece_backend(self.tokens, self.normalization, self.path)
    else:
      backend = _sentencepiece_backend(self._backend, self.lowercase)
    specials = sorted({self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id})
    backend.add_special_tokens([AddedToken(self.tokens[i], normalized=False, special=True)
                                for i in specials])
    cls, sep = self.tokens[self.cls_id], self.tokens[self.sep_id]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, self.cls_id), (sep, self.sep_id)])
    return backend.to_str()

  def convert_ids_to_tokens(self, ids) -> list[str]:
    return [self.tokens[int(i)] for i in ids]

  def convert_tokens_to_ids(self, tokens) -> list[int]:
    return [self._ids.get(t, self.unk_id) for t in tokens]

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.kind in ("wordpiece", "hf"):
      return self._backend.decode(ids, skip_special_tokens=False)
    pieces = self._backend.get_piece_size()
    if all(i < pieces for i in ids):
      return self._backend.decode(ids)
    out, run = [], []  # a token added after the model's pieces ([MASK]) is its own text
    for i in ids + [-1]:
      if 0 <= i < pieces:
        run.append(i)
        continue
      if run:
        out.append(self._backend.decode(run))
        run = []
      if i >= 0:
        out.append(self.tokens[i])
    return " ".join(out)


class VocabularyError(errors.UserError, ValueError):
  """A vocabulary file that cannot be used as it is (names the file and line)."""


def _check_unique(tokens: list[str], vocab_file: str) -> None:
  """Each token on one line: with duplicates, a token's id is its last line (as in
  transformers) and the embedding rows of its earlier lines are never used, so every later
  id is off from what the file's line numbers say: refused, naming them."""
  first, dups = {}, []
  for i, t in enumerate(tokens):
    if t in first:
      dups.append(f"{t!r} on lines {first[t] + 1} and {i + 1}")
    else:
      first[t] = i
  if dups:
    raise VocabularyError(
        f"{vocab_file} lists {len(dups)} tokens twice ({'; '.join(dups[:5])}"
        f"{'; ...' if len(dups) > 5 else ''}): each token must be on one line. Use the "
        "vocabulary the model was trained with, or build one with python -m input_pipeline.vocab.")


# Characters that BERT's normalizer leaves as they are (not control, whitespace or CJK; no
# decomposition, no case, no combining class) and its pre-tokenizer always isolates as one
# token (Unicode punctuation): the ASCII ones and the common typographic ones.
_ISOLATED = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00ab\u00bb\u00a1\u00bf"
_PIECES = re.compile(f"[{re.escape(_ISOLATED)}]|[^{re.escape(_ISOLATED)}]+")
# Rows of a table beyond this are dropped (the table restarts) between calls: memory stays
# bounded (~100 MB) on a corpus of any vocabulary of words.
_CHUNK_TABLE_ROWS = 1 << 20


class _ChunkRows(dict):
  """chunk -> its row in the table; a chunk not yet seen is added to the table."""
  __slots__ = ("add",)

  def __missing__(self, chunk: str) -> int:
    return self.add(chunk)


class _ChunkTable:
  """WordPiece ids of texts through a table of their space-separated chunks.

  Exact because BERT's tokenization is local around an ASCII space: the normalizer works
  character by character (cleaning, CJK spacing, lower-casing; NFD only reorders runs of
  combining marks, which a space, a starter, ends), and the pre-tokenizer always splits
  there and drops the space. So the ids of a text are the ids of its chunks,
  `text.split(" ")`, each encoded alone, concatenated; likewise around the characters of
  `_ISOLATED`, which are their own token. A chunk seen before costs one dict lookup. A new
  chunk of ASCII letters and digits runs WordPiece here (lower-cased as the vocabulary
  says: ASCII has no accents to strip); other new chunks are cut at `_ISOLATED` characters
  into pieces, each looked up or, when new, encoded by the Rust tokenizer itself (accents,
  other scripts, control characters, other whitespace: whatever it does).
  """

  def __init__(self, vocab: dict, unk_id: int, lowercase: bool, backend,
               max_rows: int = _CHUNK_TABLE_ROWS, max_chars_per_word: int = 100):
    self.vocab, self.unk_id, self.lowercase, self.backend = vocab, unk_id, lowercase, backend
    self.max_rows, self.max_chars_per_word = max_rows, max_chars_per_word
    # WordPiece's lookups: "##" + piece in the vocabulary, as piece -> id; no piece longer
    # than the longest entry can match.
    self.continuations = {t[2:]: i for t, i in vocab.items() if t.startswith("##")}
    self.max_len = max(map(len, vocab), default=0)
    self.max_continuation_len = max(map(len, self.continuations), default=0)
    self._reset()

  def _reset(self) -> None:
    # Row r's ids are ids[r] (a tuple); the arrays flat[starts[r]:starts[r] + lens[r]] hold
    # the same for the first `synced` rows (_sync brings them up to date; their capacity
    # doubles as needed). Row 0 is the texts' separator.
    self.ids = [()]
    self.rows = _ChunkRows({"\n": 0})
    self.rows.add = self._add
    self.flat, self.flat_used = np.zeros(1 << 16, np.int32), 0
    self.starts, self.lens = np.zeros(1 << 16, np.int64), np.zeros(1 << 16, np.int64)
    self.synced = 1

  def _wordpiece(self, word: str) -> tuple:
    """Greedy longest-match-first WordPiece of one pre-token (as the Rust model: [UNK]
    for a word over max_chars_per_word characters or with no match at some position)."""
    n = len(word)
    if n > self.max_chars_per_word:
      return (self.unk_id,)
    i = self.vocab.get(word)
    if i is not None:
      return (i,)  # Most words.
    table, longest, out, start = self.vocab, self.max_len, [], 0
    while start < n:
      end = min(n, start + longest)
      while end > start:
        i = table.get(word[start:end])
        if i is not None:
          break
        end -= 1
      else:
        return (self.unk_id,)
      out.append(i)
      start = end
      table, longest = self.continuations, self.max_continuation_len
    return tuple(out)

  def _add(self, chunk: str) -> int:
    """Adds a chunk not seen yet (see the class doc); returns its row."""
    if chunk.isascii() and chunk.isalnum():
      ids = self._wordpiece(chunk.lower() if self.lowercase else chunk)
    else:
      pieces = _PIECES.findall(chunk)
      if len(pieces) == 1:  # One character of _ISOLATED, or a piece without them.
        ids = tuple(self.backend.encode(chunk, add_special_tokens=False).ids)
      else:
        ids, rows, table = (), self.rows, self.ids
        for piece in pieces:  # none for "" (two spaces in a row)
          ids += table[rows[piece]]
    row = len(self.ids)
    self.ids.append(ids)
    self.rows[chunk] = row
    return row

  def _sync(self) -> None:
    """Copies the rows added since the last call into the arrays."""
    done, rows = self.synced, len(self.ids)
    if done == rows:
      return
    new = self.ids[done:]
    lens = np.fromiter(map(len, new), np.int64, len(new))
    flat = np.fromiter(itertools.chain.from_iterable(new), np.int32, int(lens.sum()))
    used = self.flat_used + len(flat)
    if rows > len(self.lens):
      grow = lambda a: np.concatenate([a, np.zeros(max(len(a), rows), a.dtype)])
      self.starts, self.lens = grow(self.starts), grow(self.lens)
    if used > len(self.flat):
      self.flat = np.concatenate([self.flat, np.zeros(max(len(self.flat), used), np.int32)])
    self.starts[done:rows] = self.flat_used + np.cumsum(lens) - lens
    self.lens[done:rows] = lens
    self.flat[self.flat_used:used] = flat
    self.flat_used, self.synced = used, rows

  def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """See Tokenizer.encode_flat."""
    if len(self.ids) > self.max_rows:
      self._reset()
    joined = " \n ".join(texts)
    if joined.count("\n") != len(texts) - 1:
      # BERT's normalizer turns "\n" into a space first, so this changes no ids.
      joined = " \n ".join(t.replace("\n", " ") for t in texts)
    chunks = joined.split(" ")
    rows = np.fromiter(map(self.rows.__getitem__, chunks), np.int64, len(chunks))
    self._sync()
    lens = self.lens[rows]
    ends = np.cumsum(lens)
    total = int(ends[-1])
    tokens = self.flat[np.repeat(self.starts[rows] - (ends - lens), lens) + np.arange(total)]
    text_ends = np.append(ends[rows == 0], total)
    return tokens, np.diff(text_ends, prepend=0)


def _wordpiece_backend(tokens: list[str], norm: Normalization, vocab_file: str):
  from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top  (the Rust WordPiece backend, built on first use)
  from tokenizers import decoders, models, normalizers, pre_tokenizers
  vocab = {t: i for i, t in enumerate(tokens)}
  missing = [t for t in SPECIAL_TOKENS if t not in vocab]
  if missing:
    raise _missing_special_error(vocab_file, missing)
  backend = RustTokenizer(models.WordPiece(
      vocab, unk_token="[UNK]", max_input_chars_per_word=100, continuing_subword_prefix="##"))
  # strip_accents=None: strip exactly when lower-casing, as the original BERT.
  backend.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=norm.tokenize_chinese_chars,
      strip_accents=norm.strip_accents, lowercase=norm.lowercase)
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  backend.decoder = decoders.WordPiece(prefix="##")
  return backend


def _sentencepiece_backend(processor, lowercase: bool):
  """A SentencePiece unigram model as a `tokenizers` Tokenizer: its pieces and scores, its
  normalization rules (the model's precompiled character map, then SentencePiece's
  whitespace handling: collapsed runs, a word-start marker before the first word), with our
  lower-casing first when the vocabulary is uncased."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top  (SentencePiece vocabularies only)
  from tokenizers import Regex, Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers
  proto = sentencepiece_model_pb2.ModelProto.FromString(processor.serialized_model_proto())
  if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    raise VocabularyError("Only a SentencePiece unigram model can be exported as a "
                          "tokenizer.json (this one is "
                          f"{sentencepiece_model_pb2.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)}).")
  backend = RustTokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces],
                                         unk_id=processor.unk_id(), byte_fallback=False))
  steps = [normalizers.Lowercase()] if lowercase else []
  if proto.normalizer_spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
  steps += [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "\u2581")]
  backend.normalizer = normalizers.Sequence(steps)
  backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_WORD_START, prepend_scheme="always")
  backend.decoder = decoders.Metaspace(replacement=_WORD_START, prepend_scheme="always")
  return backend


def _hf_tokenizer(vocab_file: str, data: bytes, sha256: str) -> Tokenizer:
  """A HuggingFace tokenizer.json: the special ids from its pair template (cls A sep B sep as
  BERT, or cls A sep sep B sep as RoBERTa), pad / unk / mask from tokenizer_config.json
  beside it (or the added tokens' names)."""
  from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top  (the Rust backend)
  try:
    backend = RustTokenizer.from_str(data.decode("utf-8"))
  except Exception as e:  # pylint: disable=broad-except  (the library's own parse errors)
    raise VocabularyError(f"{vocab_file} is not a tokenizer.json the tokenizers library reads "
                          f"({str(e).splitlines()[0][:200]}): use the model's own file.") from None
  n = backend.get_vocab_size(with_added_tokens=True)
  tokens = [backend.id_to_token(i) or f"[unused_id_{i}]" for i in range(n)]
  added = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
  config = _read_json_beside(vocab_file, CONFIG_NAME)
  named = lambda key: (config.get(key) or {}).get("content") if isinstance(
      config.get(key), dict) else config.get(key)
  ids = {t: i for i, t in enumerate(tokens)}
  pair = backend.encode("a", "b", add_special_tokens=True)
  layout = [("A" if s == 0 else "B") if s is not None else tokens[i]
            for i, s in zip(pair.ids, pair.sequence_ids)]
  compact = [x for j, x in enumerate(layout) if x not in "AB" or j == 0 or layout[j - 1] != x]
  b = compact.index("B") if "B" in compact else -1
  if (len(compact) < 5 or compact[1] != "A" or b != len(compact) - 2
      or len(set(compact[2:b] + compact[-1:])) != 1):
    raise VocabularyError(
        f"{vocab_file}: its post-processor encodes a pair as {' '.join(compact)}; bert_jax "
        "builds inputs as cls A sep B sep (BERT, ModernBERT) or cls A sep sep B sep "
        "(RoBERTa). Use a tokenizer.json with one of those templates.")
  cls_tok, sep_tok = compact[0], compact[2]
  mask_tok = named("mask_token") or next((t for t in ("[MASK]", "<mask>", "<|mask|>")
                                          if t in ids), None)
  pad_tok = named("pad_token") or next((t for t in ("[PAD]", "<pad>") if t in ids), sep_tok)
  unk_tok = named("unk_token") or next((t for t in ("[UNK]", "<unk>") if t in ids), pad_tok)
  missing = [k for k, t in (("mask_token", mask_tok), ("pad_token", pad_tok),
                            ("unk_token", unk_tok)) if t not in ids]
  if missing:
    raise VocabularyError(f"{vocab_file}: no {', '.join(missing)} (tokenizer_config.json beside "
                          "it names them): masked-LM pre-training and fill-mask need a mask "
                          "token.")
  special = {"pad": ids[pad_tok], "unk": ids[unk_tok], "cls": ids[cls_tok], "sep": ids[sep_tok],
             "mask": ids[mask_tok]}
  return Tokenizer("hf", vocab_file, config.get("lowercase") is True, tokens, backend, sha256,
                   Normalization(config.get("lowercase") is True, reason="tokenizer.json"),
                   special, frozenset(added), pair_seps=b - 2)


def write_tokenizer_config(directory: str, kind: str, lowercase: bool) -> None:
  """tokenizer_config.json: our `lowercase` plus, for WordPiece and byte-level BPE, the keys
  transformers reads, so `AutoTokenizer.from_pretrained(directory)` tokenizes as bert_jax
  does."""
  config = {"kind": kind, "lowercase": lowercase}
  if kind == "wordpiece":
    config.update(tokenizer_class="BertTokenizer", do_lower_case=lowercase, strip_accents=None,
                  tokenize_chinese_chars=True)
  elif kind == "bpe":  # a tokenizer.json, which names no special tokens by role
    config.update(tokenizer_class="PreTrainedTokenizerFast", **{
        f"{role}_token": t for role, t in zip(("pad", "unk", "cls", "sep", "mask"),
                                             SPECIAL_TOKENS)})
  (epath.Path(directory) / CONFIG_NAME).write_text(json.dumps(config, indent=2))
