"""What `python -m bert_jax.predict` checks before it runs a model, each refusal one line naming
what to do: the layers asked for, --max_seq_length against the model's positions, a masked-LM
head for fill-mask (named as the family's checkpoints name it), the vocabulary (its size; one
other than the checkpoint's own is warned of), the mode a fine-tuned checkpoint answers."""
from __future__ import annotations

import hashlib
import itertools
from typing import Sequence

from absl import logging

from bert_jax import families
from bert_jax import formats
from bert_jax import loader
from bert_jax import tasks
from common import errors
from input_pipeline import tokenizer as tokenizer_lib

MASK_TEXT = "[MASK]"


class PredictError(errors.UserError, ValueError):
  """An input predict cannot use (a layer the model lacks, a mode the checkpoint cannot do)."""


def parse_layers(text: str) -> list[int]:
  """--layers: comma-separated layer indices (negative count from the top)."""
  try:
    layers = [int(x) for x in text.split(",")]
  except ValueError:
    raise PredictError(f"--layers={text}: expected comma-separated integers, e.g. -1,-2 (the last "
                       "two layers) or 0 (the first).") from None
  return layers


def check_layers(layers: Sequence[int], num_layers: int, given: str | None = None) -> None:
  """Every index names one of the model's `num_layers` layers; else a PredictError saying
  which index and how many layers there are."""
  for layer in layers:
    if not -num_layers <= layer < num_layers:
      raise PredictError(
          f"--layers={given or ','.join(map(str, layers))}: layer {layer} is out of range: the model "
          f"has {num_layers} layers (0..{num_layers - 1}, or -1..-{num_layers} counting from the "
          "last).")


def check_mlm_head(cfg, params, checkpoint: str = "The checkpoint") -> None:
  """A PredictError, in the family's names, unless `params` hold a masked-LM head."""
  if formats.heads(params)["mlm"]:
    return
  classes, names = families.of(cfg).mlm_head
  if "discriminator_prediction" not in params:
    raise PredictError(f"{checkpoint} has no masked-LM head ({names}): fill-mask needs "
                       f"{classes} checkpoint, not an encoder-only one.")
  raise PredictError(
      f"{checkpoint} is an ELECTRA discriminator (ElectraForPreTraining): it has no masked-LM "
      "head, only the replaced-token one (discriminator_predictions.*): fill-mask needs ELECTRA's "
      f"generator (ElectraForMaskedLM: {names}): " + (
          f"it holds its generator: python -m bert_jax.convert --input={checkpoint} --output=OUT "
          "--to=huggingface writes it to OUT/generator; give --checkpoint=OUT/generator."
          if "generator" in params else
          "give --checkpoint= the generator's directory (a HuggingFace ElectraForMaskedLM such "
          "as electra-base-generator, or the generator/ that an export of an ELECTRA run of ours "
          "holds)."))


def mask_cut_off(text: str, max_len: int, model_max: int) -> PredictError:
  """A text whose every [MASK] lies past `max_len` tokens: raise the length, or, at the
  model's own limit, shorten the text."""
  if max_len < model_max:
    return PredictError(f"Every {MASK_TEXT} of {text[:80]!r} lies beyond --max_seq_length="
                        f"{max_len} tokens, where the text is cut: raise --max_seq_length (the "
                        f"model takes up to {model_max}) or shorten the text.")
  return PredictError(f"Every {MASK_TEXT} of {text[:80]!r} lies beyond token {max_len}, where "
                      f"the text is cut: the model takes no more: shorten the text or put the "
                      f"{MASK_TEXT} earlier.")


def max_seq_length(args, cfg) -> int:
  """--max_seq_length as the model serves it: a length given above the model's is refused
  (the texts would be cut at the model's without a word); the default is capped at it."""
  if args["max_seq_length"].present and args.max_seq_length > cfg.max_length:
    raise PredictError(
        f"--max_seq_length={args.max_seq_length}: {args.checkpoint} takes at most "
        f"{cfg.max_length} tokens a text (its position embeddings end there): set "
        f"--max_seq_length={cfg.max_length} or less (longer texts are cut there), or use a model "
        "with more positions.")
  return min(args.max_seq_length, cfg.max_length)


def check_mode(mode: str, task: dict, checkpoint: str) -> None:
  """A fine-tuned checkpoint answers only its own task's mode (a classifier's logits are
  no tags)."""
  kind, served = task.get("task"), tasks.modes()
  if kind in served[mode]:
    return
  modes = [m for m, kinds in served.items() if kind in kinds]
  raise PredictError(
      f"--mode={mode} needs a checkpoint fine-tuned for {' or '.join(served[mode])}, but "
      f"{checkpoint} was fine-tuned for task {kind!r}: "
      + (f"use --mode={modes[0]}." if modes else
         "predict has no mode for it; its dev predictions are in the workdir.")
      + " (--mode=features reads the encoder of any checkpoint.)")


def check_vocab(cfg, tokenizer, given: str | None = None, checkpoint: str | None = None
                ) -> None:
  """The vocabulary fits the model's table (else a PredictError); one `given` (--vocab) whose
  tokens are not those `checkpoint` comes with: a warning."""
  if not formats.vocabulary_fits(cfg, tokenizer.vocab_size):
    raise PredictError(f"The vocabulary has {tokenizer.vocab_size} tokens but the model {cfg.vocab_size}: "
                       "pass the vocab the checkpoint was trained with.")
  if given and checkpoint:
    _warn_other_vocab(tokenizer, given, checkpoint)


def _warn_other_vocab(tokenizer, given: str, checkpoint: str) -> None:
  """One warning when --vocab's tokens are not those of the vocabulary `checkpoint` comes with
  (a HuggingFace or export directory's, the one its run recorded: loader.checkpoint_vocab);
  nothing when it has none to compare with."""
  try:
    own_path = loader.checkpoint_vocab(checkpoint)
    _, own_file = tokenizer_lib.resolve_vocab_path(own_path)
    if hashlib.sha256(tokenizer_lib.read_bytes(own_file)).hexdigest() == tokenizer.sha256:
      return  # the same file's bytes
    own = tokenizer_lib.Tokenizer.from_path(own_path)
  except (errors.UserError, OSError):
    return
  if own.tokens == tokenizer.tokens:
    return
  differ = [i for i, (a, b) in enumerate(itertools.zip_longest(own.tokens, tokenizer.tokens))
            if a != b]
  first = differ[0]
  at = lambda tokens: repr(tokens[first]) if first < len(tokens) else "missing"
  logging.warning("--vocab=%s is not the vocabulary %s comes with (%s): %d of its %d tokens "
                  "differ (the first: id %d is %s there, %s in --vocab), so those ids mean other "
                  "tokens than the model learned: leave out --vocab to use the checkpoint's own.",
                  given, checkpoint, own.path, len(differ), own.vocab_size, first,
                  at(own.tokens), at(tokenizer.tokens))
