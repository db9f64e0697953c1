"""A checkpoint's vocabulary-indexed tensors rebuilt for another vocabulary, so that a
published encoder continues pre-training with your tokenizer (`config.vocab_transfer`).

    plan = vocab_transfer.plan(old_tokenizer, new_tokenizer, rows)
    flat = vocab_transfer.apply(loader.flat(params), plan, family.vocab_tensors)

"fvt" is Fast Vocabulary Transfer (Gee et al., 2022), row by row of the new table:
- a token the old vocabulary has keeps its row exactly: the same token string in two
  vocabularies of the same kind, else the same text starting (or continuing) a word, the
  kinds' word-start conventions compared as what they mean (WordPiece's `x` / `##x`, byte-level
  BPE's `Ġx` / `x`, SentencePiece's `▁x` / `x`);
- the special tokens map by role: [CLS] / <s>, [SEP] / </s>, [MASK] / <mask>, [PAD] / <pad>,
  [UNK] / <unk>;
- any other token is the mean of the rows of the pieces the old tokenizer cuts its text into
  (a word-start token's text cut as a word: after a space);
- a token with no usable piece (its text cut into unknown or special tokens only), and each
  row past the new vocabulary in a padded table, is the mean of the old vocabulary's rows.
"random" keeps the shared and special tokens' rows as "fvt" does and draws every other row
(the baseline FVT is measured against). The plan depends on the two vocabularies only
(deterministic); a job records its summary.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any, Iterable

from absl import logging
import numpy as np

from bert_jax import families
from bert_jax import formats
from bert_jax import loader
from common import errors
from common import fileio
from input_pipeline.tokenizer import Tokenizer

MODES = ("none", "fvt", "random")
RECORD = "vocab_transfer.json"  # in the workdir of a run that transferred
ROLES = ("pad", "unk", "cls", "sep", "mask")


class VocabTransferError(errors.UserError, ValueError):
  """Two vocabularies (or a checkpoint's tensors) the transfer cannot map."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """The old rows each new row averages (() = the mean row), and what the log says of it."""
  sources: tuple[tuple[int, ...], ...]  # one per row of the new table
  old_tokens: int  # the old vocabulary's size: its rows are the ones the mean row averages
  kept: int  # tokens of both vocabularies (their rows copied)
  by_role: int  # special tokens mapped by role
  composed: int  # tokens averaged from their pieces
  pieces: int  # the pieces those tokens were cut into, in all
  orphans: tuple[str, ...]  # tokens with no usable piece (the mean row)
  # mode "random": the rows of the tokens neither shared nor special, drawn from a normal of
  # the old rows' mean and spread (seed 0) instead of averaged (the baseline FVT is measured
  # against)
  drawn: tuple[int, ...] = ()

  def summary(self, new_tokens: int) -> str:
    if self.drawn:
      return (f"{self.kept} of {new_tokens} tokens shared with the old vocabulary "
              f"({self.kept / max(new_tokens, 1):.1%}; their rows kept), {self.by_role} special "
              f"tokens mapped by role, {len(self.drawn)} new tokens drawn at random")
    mean = self.pieces / self.composed if self.composed else 0.0
    shown = ", ".join(repr(t) for t in self.orphans[:8]) + (" ..." if len(self.orphans) > 8 else "")
    return (f"{self.kept} of {new_tokens} tokens shared with the old vocabulary "
            f"({self.kept / max(new_tokens, 1):.1%}; their rows kept), {self.by_role} special "
            f"tokens mapped by role, {self.composed} new tokens the mean of their old pieces "
            f"({mean:.2f} pieces a token), {len(self.orphans)} with no usable piece (the mean "
            f"row){': ' + shown if self.orphans else ''}")


def surface(tok, i: int) -> tuple[bool, str] | None:
  """(starts a word, its text) of token `i` of tokenizer `tok` (input_pipeline Tokenizer): the
  form tokens of two vocabularies are compared in; None when its text is no word piece (a
  special token, whitespace, or part of a character: a byte-level BPE byte)."""
  token = tok.tokens[i]
  if tok.is_special[i]:
    return None
  if tok.kind == "wordpiece":
    start = not token.startswith("##")
    text = token if start else token[2:]
  else:
    start = not bool(tok.is_continuation[i])
    text = tok.decode([i])
    text = text.strip() if start else text
  if not text or "\ufffd" in text or any(c.isspace() for c in text):
    return None
  return start, text


def _by_role(old, new) -> dict[int, int]:
  return {getattr(new, f"{r}_id"): getattr(old, f"{r}_id") for r in ROLES}


def _exact(old, new) -> dict[int, int]:
  """New id -> old id of the tokens both vocabularies have."""
  same_kind = old.kind == new.kind and _byte_level(old) == _byte_level(new)
  raw = {t: i for i, t in enumerate(old.tokens)} if same_kind else {}
  keys: dict[tuple[bool, str], int] = {}
  for i in range(len(old.tokens)):
    key = surface(old, i)
    if key is not None:
      keys.setdefault(key, i)  # the first of equal forms: deterministic
  found = {}
  for i, token in enumerate(new.tokens):
    if token in raw:
      found[i] = raw[token]
    elif (key := surface(new, i)) is not None and key in keys:
      found[i] = keys[key]
  return found


def _byte_level(tok) -> bool:
  return tok.kind == "hf" and any(t.startswith("\u0120") for t in tok.tokens)


def _markers(tok) -> set[int]:
  """The tokens that are only a word-start mark (`Ġ`, `▁`): a space, no text of the word."""
  return {i for i, t in enumerate(tok.tokens) if t in ("\u0120", "\u2581")}


def _pieces(old, new, ids: Iterable[int]) -> dict[int, tuple[int, ...]]:
  """New id -> the old tokenizer's usable pieces of its text (no unknown, no special)."""
  keys = {i: surface(new, i) for i in ids}  # None: a special token without a role, a byte
  cut = [i for i, key in keys.items() if key is not None]
  encoded = old.encode_batch([" " + keys[i][1] if keys[i][0] else keys[i][1] for i in cut])
  unusable = set(np.flatnonzero(old.is_special)) | {old.unk_id} | _markers(old)
  pieces = {i: tuple(p for p in e if p not in unusable) for i, e in zip(cut, encoded)}
  return {i: pieces.get(i, ()) for i in keys}


def plan(old, new, rows: int | None = None, mode: str = "fvt") -> Plan:
  """How the new table's `rows` rows (default: the new vocabulary's size; more in a padded
  table) are made from the old table's, for tokenizers `old` and `new`: `mode` "fvt" (new
  tokens the mean of their pieces) or "random" (drawn; see Plan.drawn)."""
  if not new.tokens:
    raise VocabTransferError(f"{new.path} holds no tokens: give the vocabulary to transfer to.")
  rows = len(new.tokens) if rows is None else rows
  if rows < len(new.tokens):
    raise VocabTransferError(f"the model's table has {rows} rows, fewer than {new.path}'s "
                             f"{len(new.tokens)} tokens.")
  role = _by_role(old, new)
  exact = {i: o for i, o in _exact(old, new).items() if i not in role}
  rest = [i for i in range(len(new.tokens)) if i not in role and i not in exact]
  cut = _pieces(old, new, rest)
  sources = [(role[i],) if i in role else (exact[i],) if i in exact else cut[i]
             for i in range(len(new.tokens))] + [()] * (rows - len(new.tokens))
  composed = [i for i in rest if cut[i]]
  if mode == "random":
    return Plan(tuple(() if i in cut else x for i, x in enumerate(sources)), len(old.tokens),
                kept=len(exact), by_role=len(role), composed=0, pieces=0, orphans=(),
                drawn=tuple(rest))
  return Plan(tuple(sources), len(old.tokens), kept=len(exact), by_role=len(role),
              composed=len(composed), pieces=sum(len(cut[i]) for i in composed),
              orphans=tuple(new.tokens[i] for i in rest if not cut[i]))


def rows(table: np.ndarray, the_plan: Plan) -> np.ndarray:
  """`table` ([old rows, ...]: an embedding table or a bias) rebuilt on axis 0 by `the_plan`,
  in its dtype (computed in float64: a kept row is bit-identical)."""
  old = np.asarray(table)
  if old.shape[0] < the_plan.old_tokens:
    raise VocabTransferError(f"a vocabulary tensor has {old.shape[0]} rows, fewer than the "
                             f"old vocabulary's {the_plan.old_tokens} tokens: the checkpoint "
                             "and its vocabulary do not belong together.")
  src = old.astype(np.float64)
  mean = src[:the_plan.old_tokens].mean(axis=0)
  out = np.broadcast_to(mean, (len(the_plan.sources),) + old.shape[1:]).copy()
  lengths = np.fromiter(map(len, the_plan.sources), np.int64, len(the_plan.sources))
  flat = np.fromiter(itertools.chain.from_iterable(the_plan.sources), np.int64,
                     int(lengths.sum()))
  used = lengths > 0
  if flat.size:
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[used]
    sums = np.add.reduceat(src[flat], starts, axis=0)
    out[used] = sums / lengths[used].reshape((-1,) + (1,) * (old.ndim - 1))
  if the_plan.drawn:
    spread = src[:the_plan.old_tokens].std(axis=0)
    noise = np.random.default_rng(0).standard_normal((len(the_plan.drawn),) + old.shape[1:])
    out[list(the_plan.drawn)] = mean + spread * noise
  return out.astype(old.dtype)


def vocab_axis(keys: tuple[str, ...], tensors: tuple[tuple[str, int], ...]) -> int | None:
  """The axis the vocabulary indexes in the parameter at path `keys`, if one of `tensors`
  (a family's Family.vocab_tensors: path endings and axes) names it; else None."""
  name = "/".join(keys)
  return next((axis for path, axis in tensors if name == path or name.endswith("/" + path)),
              None)


def apply(flat_params: dict[tuple[str, ...], Any], the_plan: Plan,
          tensors: tuple[tuple[str, int], ...]) -> dict[tuple[str, ...], Any]:
  """A copy of `flat_params` (path tuple -> array) with every tensor that `tensors` names (the
  family's Family.vocab_tensors) rebuilt by `the_plan` along its vocabulary axis."""
  out, done = dict(flat_params), []
  for keys, value in flat_params.items():
    axis = vocab_axis(keys, tensors)
    if axis is not None:
      out[keys] = np.moveaxis(rows(np.moveaxis(np.asarray(value), axis, 0), the_plan), 0, axis)
      done.append("/".join(keys))
  if not done:
    raise VocabTransferError(f"the checkpoint holds none of the tensors its family indexes by "
                             f"the vocabulary ({', '.join(p for p, _ in tensors)}): nothing to "
                             "transfer.")
  logging.info("Vocabulary transfer rebuilt %s.", ", ".join(done))
  return out


def shared_share(old, new) -> str:
  """'N of M tokens shared' between two tokenizers, for messages."""
  both = len(set(old.tokens) & set(new.tokens))
  return f"{both} of its {len(new.tokens)} tokens in the checkpoint's {len(old.tokens)}"


def _tokenizer(path: str | None) -> Tokenizer | None:
  try:
    return Tokenizer.from_path(path) if path else None
  except (FileNotFoundError, OSError):
    return None


def checkpoint_source(init_checkpoint: str, mode: str, vocab_path: str | None, cfg: Any,
                      workdir: str) -> str | tuple[Any, dict]:
  """What a pre-training job loads its first weights from: `init_checkpoint` itself when its
  vocabulary is the data's (`vocab_path`, compared by content), else, with `mode` "fvt", the
  checkpoint read on the host with its vocabulary tensors transferred to the data's (config,
  params: loader.load_into's source; the plan's summary logged and written to
  WORKDIR/vocab_transfer.json). A different vocabulary with mode "none" is a ConfigError, as
  is "fvt" where either vocabulary cannot be found."""
  try:
    old_path = loader.checkpoint_vocab(init_checkpoint)
  except formats.CheckpointNotFoundError:
    old_path = None
  old, new = _tokenizer(old_path), _tokenizer(vocab_path)
  if old is None or new is None:
    if mode == "none":
      return init_checkpoint  # nothing to compare (synthetic data, a checkpoint without one)
    raise errors.ConfigError(
        f"--config.vocab_transfer={mode} needs the vocabulary of init_checkpoint (beside it: "
        f"{old_path or 'none found'}) and of the data (data.vocab_path: {vocab_path or 'none'}).")
  if old.tokens == new.tokens:
    if mode != "none":
      logging.info("init_checkpoint %s has the data's vocabulary: nothing to transfer.",
                   init_checkpoint)
    return init_checkpoint
  if mode == "none":
    raise errors.ConfigError(
        f"init_checkpoint {init_checkpoint} was trained with another vocabulary ({old_path}) "
        f"than the data's ({vocab_path}: {shared_share(old, new)}): set "
        "--config.vocab_transfer=fvt to carry its rows over to the new tokens, or train with "
        "its vocabulary.")
  ckpt_cfg, params = loader.read(init_checkpoint, "pretraining", require_mlm=False)
  the_plan = plan(old, new, rows=cfg.vocab_size, mode=mode)
  flat = apply(loader.flat(params), the_plan, families.of(ckpt_cfg).vocab_tensors)
  summary = the_plan.summary(len(new.tokens))
  logging.info("init_checkpoint %s: vocabulary transfer (%s) from %s to %s: %s.",
               init_checkpoint, mode, old_path, vocab_path, summary)
  fileio.path(workdir).joinpath(RECORD).write_text(json.dumps({
      "mode": mode, "from": {"vocab": old_path, "sha256": old.sha256},
      "to": {"vocab": vocab_path, "sha256": new.sha256}, "summary": summary,
      "orphans": list(the_plan.orphans)}, indent=1, ensure_ascii=False))
  return ckpt_cfg.replace(vocab_size=cfg.vocab_size), loader.unflat(flat)
