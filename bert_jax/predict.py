r"""Inference: fill-mask and features from a pre-trained checkpoint; classify / QA / tag
with a fine-tuned one (the `workdir` of a fine-tuning run: its `best/` parameters).

    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=fill_mask \
        --text="The capital of France is [MASK]."
    python -m bert_jax.predict --checkpoint=DIR --vocab=vocab.txt --mode=features \
        --input_file=texts.txt --layers=-1,-2 --output=features.npy
    python -m bert_jax.predict --checkpoint=DIR --mode=embed --input_file=texts.txt \
        --output=embeddings.npy [--pooling=mean|cls|last] [--normalize] [--truncate_dim=N]

    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=classify \
        --text="The book was good." [--text_pair=...]
    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=qa \
        --question="Who?" --context="..."
    python -m bert_jax.predict --checkpoint=FINETUNE_WORKDIR --vocab=vocab.txt --mode=tag --text="EU rejects it"

For fill_mask / features / embed, `--checkpoint` is anything `bert_jax.loader.read` reads (a bert_jax
export, a HuggingFace directory, a Google TF checkpoint, for embed a sentence-transformers
directory too: its pooling and normalisation are the defaults) or a bert_jax training workdir.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import embed
from bert_jax import embed_eval
from bert_jax import families
from bert_jax import finetuned
from bert_jax import formats
from bert_jax import loader
from bert_jax import predict_checks
from bert_jax import predict_output
from bert_jax import registry
from bert_jax.predict_checks import MASK_TEXT, PredictError
from common import errors
from common import fileio
from input_pipeline import features
from input_pipeline import text as text_lib
from input_pipeline.tokenizer import Tokenizer


def load_checkpoint(path: str, target: str = "pretraining", require_mlm: bool = True):
  """(model config, unrolled params) for inference from any supported checkpoint."""
  cfg, params = loader.read(path, target, require_mlm=require_mlm)
  return cfg.replace(scan_layers=False, remat="none"), params


def encode_with_masks(tokenizer, text: str, max_len: int) -> list[int]:
  """[CLS] text [SEP], with each literal "[MASK]" becoming the mask id."""
  parts = text.split(MASK_TEXT)
  pieces = tokenizer.encode_batch(parts)
  ids = [tokenizer.cls_id]
  for i, piece in enumerate(pieces):
    if i:
      ids.append(tokenizer.mask_id)
    ids += list(piece)
  ids = ids[:max_len - 1] + [tokenizer.sep_id]
  return ids


def _pad(rows: Sequence[Sequence[int]], length: int, num_rows: int | None = None):
  ids = np.zeros((num_rows or len(rows), length), np.int32)
  mask = np.zeros_like(ids)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  return ids, mask


def _bucket(n: int, low: int = 16, high: int | None = None) -> int:
  """n rounded up to a power of two (at least `low`, at most `high`): few shapes to compile."""
  b = max(low, 1 << max(n - 1, 0).bit_length())
  return min(b, high) if high else b


def chunks(items: Iterable, size: int) -> Iterator[list]:
  """`items` in lists of `size` (the last may be shorter), read lazily."""
  it = iter(items)
  while chunk := list(itertools.islice(it, size)):
    yield chunk


@functools.lru_cache(maxsize=8)
def _mlm_logits_fn(cfg, nsp: bool):
  module = registry.masked_lm(cfg, nsp=nsp)
  return jax.jit(lambda prm, a, b, c: jax.nn.softmax(
      module.apply({"params": prm}, a, jnp.zeros_like(a), b, c)["mlm_logits"], -1))


def fill_mask(cfg, params, tokenizer, texts: Sequence[str], top_k: int = 5, max_len: int = 128,
              batch_size: int = 32):
  """For each text, for each [MASK]: the top_k (token, probability) (see iter_fill_mask);
  no [MASK] in any text is a PredictError."""
  results = list(iter_fill_mask(cfg, params, tokenizer, texts, top_k, max_len, batch_size))
  if not any(results):
    raise PredictError(f"No {MASK_TEXT} in the input: write e.g. 'Paris is the {MASK_TEXT} of France.'")
  return results


def iter_fill_mask(cfg, params, tokenizer, texts: Iterable[str], top_k: int = 5,
                   max_len: int = 128, batch_size: int = 32) -> Iterator[list]:
  """Per text, per [MASK]: the top_k (token as text, probability), computed `batch_size` texts at a
  time as `texts` is read (memory does not grow with the number of texts). A text whose
  every [MASK] lies beyond `max_len` tokens is a PredictError naming it."""
  predict_checks.check_mlm_head(cfg, params)
  h = formats.heads(params)
  if h["pooler"] and not h["nsp"]:  # a pooler without the NSP head: unused by the MLM model
    params = {**params, "bert": {k: v for k, v in params["bert"].items() if k != "pooler"}}
  fn = _mlm_logits_fn(cfg, h["nsp"])
  max_len = min(max_len, cfg.max_length)
  for batch in chunks(texts, batch_size):
    rows = [encode_with_masks(tokenizer, t, max_len) for t in batch]
    positions = [[j for j, t in enumerate(r) if t == tokenizer.mask_id] for r in rows]
    for text, x in zip(batch, positions):
      if not x and MASK_TEXT in text:
        raise predict_checks.mask_cut_off(text, max_len, cfg.max_length)
    ids, mask = _pad(rows, _bucket(max(map(len, rows)), high=max_len), batch_size)
    pos = np.zeros((batch_size, _bucket(max(map(len, positions)), low=1)), np.int32)
    for i, x in enumerate(positions):
      pos[i, :len(x)] = x
    probs = np.asarray(fn(params, ids, mask, pos))
    for i, x in enumerate(positions):
      per_mask = []
      for k in range(len(x)):
        best = np.argsort(probs[i, k])[::-1][:top_k]
        per_mask.append([(_shown(tokenizer, b), float(probs[i, k, b])) for b in best])
      yield per_mask


def _shown(tokenizer, token_id: int) -> str:
  """A candidate as text, as transformers' fill-mask shows it: decoded ("work", not the
  byte-level BPE piece "Ġwork"); a piece that decodes to nothing shown as it is."""
  return tokenizer.decode([int(token_id)]).strip() or tokenizer.convert_ids_to_tokens([token_id])[0]


def extract_features(cfg, params, tokenizer, texts: Sequence[str], layers: Sequence[int] = (-1,),
                     max_len: int = 128, pooled: bool = False, batch_size: int = 32):
  """Hidden states [N, L, len(layers), D] of the chosen layers (or pooled [N, D])."""
  outs, masks = [], []
  for _, feats, mask in iter_features(cfg, params, tokenizer, texts, layers, max_len, pooled,
                                      batch_size):
    outs.append(feats)
    masks.append(mask)
  return np.concatenate(outs), np.concatenate(masks)


def feature_fn(cfg, params, layers: Sequence[int] = (-1,), pooled: bool = False
               ) -> Callable[[np.ndarray, np.ndarray], tuple[jax.Array | None, jax.Array]]:
  """A jitted (ids [b, L], mask [b, L]) -> (pooled [b, D] when `pooled`, else None; the
  hidden states [b, L, len(layers), D] of `layers`, counted as the encoder's layers: 0 the
  first, -1 the last)."""
  predict_checks.check_layers(layers, cfg.num_layers)
  encoder_params, has_pooler = embed.encoder_params(params)
  if pooled and not has_pooler:
    raise PredictError("The checkpoint has no pooler (e.g. a BertForMaskedLM checkpoint): "
                       "--pooled is not available; take a layer's [CLS] vector instead.")
  module = families.of(cfg).encoder(cfg, add_pooler=has_pooler)

  @jax.jit
  def run(a, b):
    variables, segments = {"params": encoder_params}, jnp.zeros_like(a)
    if pooled:
      return module.apply(variables, a, segments, b)[1], None
    # [embeddings, layer 1, ..., layer N], the last the model's output (a final norm applied)
    hidden = module.apply(variables, a, segments, b, method=module.hidden_states)[1:]
    return None, jnp.stack([hidden[l] for l in layers], axis=2)

  return run


def iter_features(cfg, params, tokenizer, texts: Iterable[str], layers: Sequence[int] = (-1,),
                  max_len: int = 128, pooled: bool = False, batch_size: int = 32):
  """(ids [b, L], features [b, L, len(layers), D] or pooled [b, D], mask [b, L]) per batch
  of `batch_size` texts, read from `texts` as they come (memory flat in their number)."""
  run = feature_fn(cfg, params, layers, pooled)
  max_len = min(max_len, cfg.max_length)
  texts = iter(texts)
  while batch := list(itertools.islice(texts, batch_size)):
    rows = [features.encode_pair(tokenizer, list(r)[:max_len - 2])[0]
            for r in tokenizer.encode_batch(batch)]
    ids, mask = _pad(rows, max_len, batch_size)  # one shape to compile: the last batch padded
    pool, hidden = run(ids, mask)
    n = len(rows)
    yield ids[:n], np.asarray(pool if pooled else hidden)[:n], mask[:n]


def _flags():
  """predict's flags, in their own FlagValues (absl syntax; importing adds no global flags)."""
  fv = flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "A checkpoint (fill_mask, features) or a fine-tuning "
                      "workdir (classify, qa, tag).", flag_values=fv)
  flags.DEFINE_string("vocab", None, "vocab.txt or SentencePiece model the model was trained "
                      "with, or the directory holding it. Default: the checkpoint's own (a "
                      "HuggingFace or export directory's, the vocabulary a workdir of ours "
                      "recorded); one whose tokens differ from that is warned of.", flag_values=fv)
  flags.DEFINE_bool("lowercase", None, "Override the vocabulary's casing (--lowercase / "
                    "--nolowercase; default: as the files beside it say, e.g. do_lower_case "
                    "in a HuggingFace tokenizer_config.json).", flag_values=fv)
  flags.DEFINE_enum("mode", "fill_mask", ["fill_mask", "features", "embed", "classify", "qa",
                                          "tag"], "What to predict.", flag_values=fv)
  flags.DEFINE_multi_string("text", [], "Input text (repeatable).", flag_values=fv)
  flags.DEFINE_multi_string("text_pair", [], "classify: second segment per --text.",
                            flag_values=fv)
  flags.DEFINE_string("question", None, "qa: the question.", flag_values=fv)
  flags.DEFINE_string("context", None, "qa: the passage holding the answer.", flag_values=fv)
  flags.DEFINE_string("input_file", None, "One text per line (read as it is used); a blank "
                      "line keeps its place (features / embed: a row of zeros, mask 0, "
                      "\"blank\": true in .jsonl; classify: a record with \"blank\": true; "
                      "fill_mask, tag: an empty line).", flag_values=fv)
  flags.DEFINE_integer("top_k", 5, "fill_mask: candidates per [MASK].", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("layers", "-1", "features: comma-separated layer indices.", flag_values=fv)
  flags.DEFINE_bool("pooled", False, "features: write the pooled output instead.",
                    flag_values=fv)
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "embed: how token vectors become "
                    "a text's (default: a sentence-transformers checkpoint's own, else mean).",
                    flag_values=fv)
  flags.DEFINE_bool("normalize", None, "embed: L2-normalise the vectors (default: as a "
                    "sentence-transformers checkpoint says, else not).", flag_values=fv)
  flags.DEFINE_integer("truncate_dim", None, "embed: keep the vectors' first N components (a "
                       "Matryoshka model's smaller embedding; normalised after the cut).",
                       lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("max_seq_length", 128, "Tokens per input, [CLS] and [SEP] included "
                       f"(longer ones are cut); at least {MIN_SEQ_LENGTH}, at most the model's "
                       "positions (unset: 128, or the model's if fewer).",
                       lower_bound=MIN_SEQ_LENGTH, flag_values=fv)
  flags.DEFINE_integer("batch_size", 32, "Inputs per forward pass.", lower_bound=1,
                       flag_values=fv)
  flags.DEFINE_string("output", None, "features / embed: the file to write: .npy (default "
                      "features.npy / embeddings.npy; features with FILE_mask.npy beside it) or "
                      ".jsonl (features: Google's extract_features.py format; embed: "
                      "{\"line_index\", \"embedding\"} a line, line_index counting --text "
                      "then --input_file's lines from 0). fill_mask, tag (.txt), classify, qa "
                      "(.jsonl): what they print, written there instead (unset: stdout). Any "
                      "other suffix is refused.", flag_values=fv)
  return fv


MIN_SEQ_LENGTH = 3  # [CLS] one token [SEP]


_SNIFF_BYTES = 1 << 16


def _input_lines(path: str) -> Iterator[str]:
  """Every line of a text file, blank ones too (each mode answers each line in its place),
  read as they are used (a BOM is dropped); a line ends at "\\n", a "\\r" before it is
  dropped. A file whose first 64 KiB hold a NUL byte or more than 1% of bytes that are not
  UTF-8 (a binary file, another encoding) is refused, as prepare refuses one; a few such
  bytes become U+FFFD, said in one warning at the end."""
  with fileio.path(path).open("rb") as f:
    head = f.read(_SNIFF_BYTES)
    sniffed = {"replaced_bytes": 0}
    text_lib.decode_bytes(head, sniffed)
    if b"\x00" in head or sniffed["replaced_bytes"] > text_lib.MAX_REPLACED_FRACTION * len(head):
      raise PredictError(
          f"--input_file={path} is not UTF-8 text: of its first {len(head):,} bytes "
          f"{sniffed['replaced_bytes']:,} are not UTF-8" + (" and some are NUL" if b"\x00" in head
                                                          else "") +
          " (a binary file, or another encoding?). Give a UTF-8 text file, one text per line.")
    f.seek(0)
    stats, first_bad = {"replaced_bytes": 0}, None
    for i, raw in enumerate(iter(f.readline, b"")):
      before = stats["replaced_bytes"]
      line = text_lib.decode_bytes(raw, stats).rstrip("\n").rstrip("\r")
      if first_bad is None and stats["replaced_bytes"] > before:
        first_bad = i + 1
      yield line.removeprefix("\ufeff") if i == 0 else line
  if first_bad is not None:
    logging.warning("%s: %d bytes are not UTF-8 (the first on line %d) and were read as U+FFFD: "
                    "save the file as UTF-8 to keep those characters.", path,
                    stats["replaced_bytes"], first_bad)


class _Progress:
  """Counts the inputs passing through; a line on stderr every `every_s` seconds and at the
  end (when there were more than one batch)."""

  def __init__(self, items: Iterable, what: str, every_s: float = 10.0):
    self.items, self.what, self.every_s = items, what, every_s
    self.count, self.start = 0, time.perf_counter()

  def __iter__(self):
    last = self.start
    for item in self.items:
      yield item
      self.count += 1
      now = time.perf_counter()
      if now - last >= self.every_s:
        last = now
        self._line("so far")

  def _line(self, when: str) -> None:
    elapsed = time.perf_counter() - self.start
    print(f"predict: {self.count:,} {self.what} {when} ({self.count / max(elapsed, 1e-9):,.1f}/s, "
          f"{elapsed:.1f} s)", file=sys.stderr, flush=True)

  def done(self) -> None:
    if time.perf_counter() - self.start >= self.every_s:
      self._line("in all")


@errors.reported
def main(argv: Sequence[str] | None = None) -> None:
  """`argv`: the flags (without the program name; default sys.argv[1:])."""
  args = _flags()
  errors.parse_flags(args, ["predict"] + list(sys.argv[1:] if argv is None else argv), __doc__)
  errors.require_flags(args, "checkpoint")
  if args.input_file and not fileio.path(args.input_file).is_file():
    raise PredictError(f"--input_file={args.input_file} does not exist.")
  if args.text_pair and (args.input_file or len(args.text_pair) != len(args.text)):
    raise PredictError("--text_pair gives the second segment of each --text: give as many of "
                       "each (not with --input_file).")
  texts = itertools.chain(args.text, _input_lines(args.input_file) if args.input_file else ())
  out = args.output or ("embeddings.npy" if args.mode == "embed" else "features.npy")
  if args.mode in ("features", "embed") or args.output:
    predict_output.check_output(out, args.mode)
  # The checkpoint's own vocabulary by default, read once the checkpoint is known good.
  vocabulary = lambda: Tokenizer.from_path(args.vocab or loader.checkpoint_vocab(args.checkpoint),
                                           args.lowercase)
  if args.mode in ("classify", "qa", "tag"):
    with predict_output.printed_to(args.output):
      _finetuned_mode(args, texts, vocabulary)
    return
  if not (args.text or args.input_file):
    raise PredictError("Give --text (repeatable) or --input_file.")
  if args.mode == "fill_mask":
    with predict_output.printed_to(args.output):
      _fill_mask(args, texts, vocabulary)
  elif args.mode == "embed":
    _embed(args, texts, out)
  else:
    _features(args, texts, out, vocabulary)


def _finetuned_mode(args, texts: Iterable[str], vocabulary) -> None:
  """--mode=classify / qa / tag: a fine-tuning run's best/ on the inputs."""
  cfg, params, task, labels = finetuned.load(args.checkpoint)
  predict_checks.check_mode(args.mode, task, args.checkpoint)
  tokenizer = vocabulary()
  predict_checks.check_vocab(cfg, tokenizer, args.vocab, args.checkpoint)
  if args.mode == "qa":
    if not (args.question and args.context):
      raise PredictError("--mode=qa needs --question and --context.")
    print(json.dumps({"question": args.question, "answer": finetuned.answer(
        cfg, params, task, tokenizer, args.question, args.context)}))
    return
  if not (args.text or args.input_file):
    raise PredictError("Give --text (repeatable) or --input_file.")
  progress = _Progress(texts, "texts")

  def real(text: str) -> bool:
    """Not blank: a blank input gets its line and no prediction (--text_pair's never is)."""
    return bool(text.strip() or args.text_pair)

  if args.mode == "classify":
    inputs, shown = itertools.tee(progress)
    results = finetuned.iter_classify(cfg, params, task, labels, tokenizer, filter(real, inputs),
                                      args.text_pair or None, args.batch_size)
    for text in shown:
      label, p, _ = next(results) if real(text) else (None, None, None)
      print(json.dumps({"text": text, "prediction": label, "probability": p,
                        **({} if real(text) else {"blank": True})}))
  else:
    for text in progress:
      print(" ".join(f"{w}/{t}" for w, t in (finetuned.tag(
          cfg, params, task, labels, tokenizer, text) if real(text) else ())))
  progress.done()


def _fill_mask(args, texts: Iterable[str], vocabulary) -> None:
  """--mode=fill_mask: the top_k tokens of each [MASK], printed."""
  # (Any checkpoint read: one without a masked-LM head is told so in its family's names.)
  cfg, params = load_checkpoint(args.checkpoint, "pretraining", require_mlm=False)
  predict_checks.check_mlm_head(cfg, params, args.checkpoint)
  max_len = predict_checks.max_seq_length(args, cfg)
  tokenizer = vocabulary()
  predict_checks.check_vocab(cfg, tokenizer, args.vocab, args.checkpoint)
  progress = _Progress(texts, "texts")
  inputs, shown = itertools.tee(progress)
  any_mask = False
  for text, per_mask in zip(shown, iter_fill_mask(cfg, params, tokenizer, inputs, args.top_k,
                                                  max_len, args.batch_size)):
    any_mask |= bool(per_mask)
    print(text)
    for k, cands in enumerate(per_mask):
      print(f"  [MASK] #{k + 1}: " + ", ".join(f"{t} ({p:.3f})" for t, p in cands))
  progress.done()
  if not any_mask:
    raise PredictError(f"No {MASK_TEXT} in the input: write e.g. 'Paris is the {MASK_TEXT} of France.'")


def _features(args, texts: Iterable[str], out: str, vocabulary) -> None:
  """--mode=features: hidden states of the chosen layers, streamed into .npy or .jsonl."""
  layers = predict_checks.parse_layers(args.layers)
  cfg, params = load_checkpoint(args.checkpoint, "encoder")
  max_len = predict_checks.max_seq_length(args, cfg)
  tokenizer = vocabulary()
  predict_checks.check_vocab(cfg, tokenizer, args.vocab, args.checkpoint)
  predict_checks.check_layers(layers, cfg.num_layers, args.layers)
  progress, blanks = _Progress(texts, "texts"), []
  inputs, shown = itertools.tee(progress)
  batches = _blank_rows(iter_features(cfg, params, tokenizer, inputs, layers, max_len,
                                      args.pooled, args.batch_size),
                        shown, blanks)
  if out.endswith(".jsonl"):
    with fileio.path(out).open("wb") as f:
      n = predict_output.write_features_jsonl(f, batches, tokenizer, layers, args.pooled)
    shape = [n]
  else:  # .npy: the rows are counted first, so that the file is written as they come
    shape = list(predict_output.write_features_npy(out, batches, _count_inputs(args)))
  progress.done()
  print(json.dumps({"output": out, "shape": shape, "layers": layers, "pooled": args.pooled,
                    **_said_blank(blanks)}))


def _blank_rows(batches, texts: Iterator[str], blanks: list[int]):
  """The (ids, values, mask) batches with the rows of blank texts zeroed, mask included (a
  row for every line, so that row i is line i's); `texts` are the batches' texts, read in
  step with them; the index of each blank one is appended to `blanks`."""
  done = 0
  for ids, values, mask in batches:
    rows = [i for i, t in enumerate(itertools.islice(texts, len(values))) if not t.strip()]
    if rows:
      values, mask = np.array(values), np.array(mask)
      values[rows], mask[rows] = 0, 0
      blanks.extend(done + i for i in rows)
    done += len(values)
    yield ids, values, mask


def _said_blank(blanks: list[int]) -> dict:
  """The report's count of blank lines (zero rows), said in a warning too; {} for none."""
  if not blanks:
    return {}
  logging.warning("%d blank inputs (the first: input %d, counted from 0) have rows of zeros "
                  "(features: mask 0; .jsonl: \"blank\": true).", len(blanks), blanks[0])
  return {"blank_lines": len(blanks)}


def _count_inputs(args) -> int:
  """The texts given (--text, then the lines of --input_file): a .npy header's row count."""
  return len(args.text) + (sum(1 for _ in _input_lines(args.input_file))
                           if args.input_file else 0)


def _embed(args, texts: Iterable[str], out: str) -> None:
  """--mode=embed: one vector a text, streamed into a .npy or .jsonl file."""
  cfg, params, tokenizer, spec = embed_eval.load(
      args.checkpoint, args.vocab, args.lowercase, args.pooling, args.normalize,
      args.max_seq_length if args["max_seq_length"].present else None, args.truncate_dim)
  max_len = predict_checks.max_seq_length(args, cfg)  # (given above the model's: refused)
  if spec.max_seq_length is None:
    spec = dataclasses.replace(spec, max_seq_length=max_len)
  predict_checks.check_vocab(cfg, tokenizer, args.vocab, embed.transformer_dir(args.checkpoint))
  progress, blanks = _Progress(texts, "texts"), []
  inputs, shown = itertools.tee(progress)
  vectors = embed.iter_embeddings(cfg, params, tokenizer, inputs, spec, args.batch_size)
  batches = _blank_rows(((None, v, np.ones(len(v), bool)) for v in vectors), shown, blanks)
  if out.endswith(".jsonl"):
    with fileio.path(out).open("wb") as f:
      n = predict_output.write_embeddings_jsonl(f, batches)
    shape = [n, embed.dim(cfg, spec)]
  else:
    shape = list(predict_output.write_features_npy(out, batches, _count_inputs(args),
                                                   masks=False))
  progress.done()
  print(json.dumps({"output": out, "shape": shape, "pooling": spec.pooling,
                    "normalize": spec.normalize, "truncate_dim": spec.truncate_dim,
                    **_said_blank(blanks)}))


if __name__ == "__main__":
  main()
