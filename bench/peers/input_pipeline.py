r"""Input pipeline throughput: ours vs Google's original generator vs HuggingFace's collator.

  python -m bench.peers.input_pipeline [--corpus=GLOB|default] [--seconds=20] [--smoke]

Examples per second per CPU core at L=128 (P=20) and L=512 (P=76), on the same tokens:
  ours            PretrainIterator (NSP pairs + dynamic masking), batches of 256, measured
                  with all cores and pinned to one core (a child process);
  google          a faithful pure-Python re-implementation of google-research/bert
                  create_pretraining_data.py (create_instances_from_document +
                  create_masked_lm_predictions + conversion to padded id features, no
                  TFRecord writing), single-threaded: its static generation rate;
  hf_collator     transformers DataCollatorForLanguageModeling (torch, 1 thread) on
                  pre-chunked single segments of L tokens: masking + padding only.
The default corpus is ../shared/data/gutenberg when present, else the built-in corpus. The
vocabulary and prepared corpus are built once into --workdir. Results are printed and,
except with --smoke, appended to bench/results/peers.md.
"""
import collections
import json
import os
import pathlib
import random
import sys
import tempfile
import time

from absl import flags
from bench import harness

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = pathlib.Path(harness.REPO)
GUTENBERG = REPO.parent / "shared" / "data" / "gutenberg"
SETTINGS = ((128, 20), (512, 76))


# ------------------------------------------------------------------------- corpus


def build_corpus(spec: str, workdir: str, vocab_size: int, vocab_chars: int) -> dict:
  """Vocabulary + prepared corpus for `spec` in workdir (reused when already built)."""
  from input_pipeline import prepare  # pylint: disable=g-import-not-at-top
  from input_pipeline import store  # pylint: disable=g-import-not-at-top
  from input_pipeline import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab_dir, prepared = os.path.join(workdir, "vocab"), os.path.join(workdir, "prepared")
  try:
    summary = prepare.load_summary(prepared)
    if summary["input"] != spec:
      raise FileNotFoundError
  except (FileNotFoundError, store.FormatError):
    vocab = vocab_lib.train_vocab(spec, vocab_dir, vocab_size=vocab_size, max_chars=vocab_chars)
    summary = prepare.prepare_corpus(spec, vocab, prepared, num_shards=8, progress=False)
  return {"prepared": prepared, "vocab": summary["vocab"]["path"], "summary": summary}


def reference_documents(prepared: str, max_tokens: int) -> list[list[list[int]]]:
  """Documents (lists of sentences of ids) for the references, up to max_tokens."""
  from input_pipeline import documents  # pylint: disable=g-import-not-at-top
  corpus = documents.load_documents(prepared, eval_fraction=0.0, nsp=False,
                                   doc_piece_tokens=0)
  tokens, sent_start = corpus["tokens"], corpus["sent_start"]
  # Whole documents would be a few huge books: take ~2k-token slices of many documents.
  docs, total = [], 0
  for first, stop in zip(corpus["doc_first"], corpus["doc_stop"]):
    for s0 in range(int(first), int(stop), 80):
      s1 = min(s0 + 80, int(stop))
      docs.append([tokens[sent_start[s]:sent_start[s + 1]].tolist() for s in range(s0, s1)])
      total += int(sent_start[s1] - sent_start[s0])
      if total >= max_tokens:
        return docs
  return docs


# ------------------------------------------------------------------------- ours


def measure_ours(corpus: dict, max_seq_length: int, max_predictions: int, seconds: float,
                 batch_size: int = 256) -> float:
  """Examples/s of PretrainIterator (after the first batch, which builds the pipeline)."""
  from input_pipeline import data_config, pretrain  # pylint: disable=g-import-not-at-top
  cfg = data_config.default_data_config()
  cfg.prepared_dir, cfg.vocab_path = corpus["prepared"], corpus["vocab"]
  cfg.max_seq_length, cfg.max_predictions_per_seq = max_seq_length, max_predictions
  it = pretrain.PretrainIterator(cfg, batch_size=batch_size, seed=0)
  next(it)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    count += len(next(it)["input_ids"])
  return count / (time.perf_counter() - start)


def measure_ours_one_core(corpus: dict, max_seq_length: int, max_predictions: int,
                          seconds: float) -> float:
  """measure_ours in a child process pinned to one CPU (TF sizes its pools from that)."""
  code = ("import json, os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
          "from bench.peers import input_pipeline as b; "
          "print(json.dumps(b.measure_ours(*json.loads(sys.argv[1]))))")
  args = json.dumps([corpus, max_seq_length, max_predictions, seconds])
  return float(harness.run_child([sys.executable, "-c", code, args], cwd=str(REPO), mark=""))


# ------------------------------------------------------------------------- google


MaskedLm = collections.namedtuple("MaskedLm", ["index", "label"])


def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
  while len(tokens_a) + len(tokens_b) > max_num_tokens:
    trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    if rng.random() < 0.5:
      del trunc[0]
    else:
      trunc.pop()


def google_masked_lm(tokens, masked_lm_prob, max_predictions, vocab_words, rng):
  """create_masked_lm_predictions (without whole-word masking)."""
  cand = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
  rng.shuffle(cand)
  output = list(tokens)
  num_to_predict = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
  masked, covered = [], set()
  for index in cand:
    if len(masked) >= num_to_predict:
      break
    if index in covered:
      continue
    covered.add(index)
    if rng.random() < 0.8:
      new = "[MASK]"
    elif rng.random() < 0.5:
      new = tokens[index]
    else:
      new = vocab_words[rng.randint(0, len(vocab_words) - 1)]
    output[index] = new
    masked.append(MaskedLm(index, tokens[index]))
  masked.sort(key=lambda x: x.index)
  return output, [m.index for m in masked], [m.label for m in masked]


def google_instances(all_documents, document_index, max_seq_length, short_seq_prob,
                     masked_lm_prob, max_predictions, vocab_words, rng):
  """create_instances_from_document, as in the original."""
  document = all_documents[document_index]
  max_num_tokens = max_seq_length - 3
  target = max_num_tokens
  if rng.random() < short_seq_prob:
    target = rng.randint(2, max_num_tokens)
  instances, chunk, length, i = [], [], 0, 0
  while i < len(document):
    chunk.append(document[i])
    length += len(document[i])
    if i == len(document) - 1 or length >= target:
      if chunk:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = [t for seg in chunk[:a_end] for t in seg]
        tokens_b = []
        if len(chunk) == 1 or rng.random() < 0.5:
          is_random_next = True
          target_b = target - len(tokens_a)
          for _ in range(10):
            r = rng.randint(0, len(all_documents) - 1)
            if r != document_index:
              break
          random_document = all_documents[r]
          for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
            tokens_b.extend(random_document[j])
            if len(tokens_b) >= target_b:
              break
          i -= len(chunk) - a_end
        else:
          is_random_next = False
          for seg in chunk[a_end:]:
            tokens_b.extend(seg)
        google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
        tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
        tokens, positions, labels = google_masked_lm(tokens, masked_lm_prob, max_predictions,
                                                     vocab_words, rng)
        instances.append((tokens, segment_ids, is_random_next, positions, labels))
      chunk, length = [], 0
    i += 1
  return instances


def google_features(instance, vocab, max_seq_length, max_predictions):
  """write_instance_to_example_files' conversion to padded ids (no TFRecord writing)."""
  tokens, segment_ids, is_random_next, positions, labels = instance
  input_ids = [vocab[t] for t in tokens]
  pad = max_seq_length - len(input_ids)
  feats = {"input_ids": input_ids + [0] * pad, "input_mask": [1] * len(input_ids) + [0] * pad,
           "segment_ids": segment_ids + [0] * pad}
  pad = max_predictions - len(positions)
  feats["masked_lm_positions"] = positions + [0] * pad
  feats["masked_lm_ids"] = [vocab[t] for t in labels] + [0] * pad
  feats["masked_lm_weights"] = [1.0] * len(labels) + [0.0] * pad
  feats["next_sentence_labels"] = [1 if is_random_next else 0]
  return feats


def measure_google(docs_ids, tokens: list[str], max_seq_length, max_predictions, seconds):
  all_documents = [[[tokens[t] for t in s] for s in d] for d in docs_ids]
  vocab = {t: i for i, t in enumerate(tokens)}
  rng = random.Random(12345)
  rng.shuffle(all_documents)
  count, start, d = 0, time.perf_counter(), 0
  while time.perf_counter() - start < seconds:
    for inst in google_instances(all_documents, d % len(all_documents), max_seq_length, 0.1,
                                 0.15, max_predictions, tokens, rng):
      google_features(inst, vocab, max_seq_length, max_predictions)
      count += 1
    d += 1
  return count / (time.perf_counter() - start)


# ------------------------------------------------------------------------- HuggingFace


def measure_hf(docs_ids, vocab_file, max_seq_length, seconds, batch_size=256):
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import BertTokenizer  # pylint: disable=g-import-not-at-top
  from transformers import DataCollatorForLanguageModeling
  torch.set_num_threads(1)
  tok = BertTokenizer(vocab=vocab_file)
  collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15,
                                             return_tensors="pt")
  flat = [t for d in docs_ids for s in d for t in s]
  n = max_seq_length - 2
  examples = [{"input_ids": [tok.cls_token_id, *flat[i:i + n], tok.sep_token_id]}
              for i in range(0, len(flat) - n, n)]
  count, start, i = 0, time.perf_counter(), 0
  while time.perf_counter() - start < seconds:
    batch = [examples[(i + j) % len(examples)] for j in range(batch_size)]
    collator(batch)
    count += batch_size
    i += batch_size
  return count / (time.perf_counter() - start)


# ------------------------------------------------------------------------- report


def machine() -> str:
  """The CPU line, and the load average when the run ended."""
  return f"{harness.machine()}; load average {harness.load_average()} at the end"


def table(rows: list[dict]) -> str:
  lines = ["| pipeline | L | P | cores | examples/s | examples/s/core |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['pipeline']} | {r['L']} | {r['P']} | {r['cores']} | "
                 f"{r['rate']:,.0f} | {r['rate'] / r['cores']:,.0f} |")
  return "\n".join(lines)


def _flag_values() -> flags.FlagValues:
  fv = flags.FlagValues()
  flags.DEFINE_string("corpus", None, "Corpus spec (default: Gutenberg if present, else the "
                      "built-in corpus).", flag_values=fv)
  flags.DEFINE_float("seconds", 20.0, "Measuring time per pipeline and setting.",
                     flag_values=fv)
  flags.DEFINE_string("workdir", os.path.join(tempfile.gettempdir(), "bert_jax_bench_input"),
                      "Where the vocabulary and prepared corpus are cached.", flag_values=fv)
  flags.DEFINE_integer("vocab_size", 30522, "WordPiece vocabulary size.", flag_values=fv)
  flags.DEFINE_boolean("smoke", False, "Seconds-long run on a tiny corpus; writes nothing.",
                       flag_values=fv)
  return fv


def main(argv: list[str]) -> list[dict]:
  fv = _flag_values()
  fv(argv)
  cores = len(os.sched_getaffinity(0))
  if fv.smoke:
    from input_pipeline import testing  # pylint: disable=g-import-not-at-top
    tmp = tempfile.mkdtemp()
    tagged = testing.make_tagged_corpus(tmp, num_docs=8, sentences_per_doc=(20, 40))
    corpus = {"prepared": tagged["prepared"], "vocab": tagged["vocab"]}
    spec, seconds, settings, ref_tokens = "tagged test corpus", 0.3, ((64, 10),), 20_000
  else:
    spec = fv.corpus or (f"{GUTENBERG}/*.txt" if GUTENBERG.is_dir() else "default")
    corpus = build_corpus(spec, os.path.join(fv.workdir, f"v{fv.vocab_size}"),
                          fv.vocab_size, vocab_chars=30_000_000)
    corpus = {"prepared": corpus["prepared"], "vocab": corpus["vocab"]}
    seconds, settings, ref_tokens = fv.seconds, SETTINGS, 3_000_000
  from input_pipeline import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  tok = tokenizer_lib.Tokenizer.from_path(corpus["vocab"])
  docs = reference_documents(corpus["prepared"], ref_tokens)
  rows = []
  for length, preds in settings:
    measures = [("ours", cores, lambda: measure_ours(corpus, length, preds, seconds)),
                ("ours (pinned to 1 core)", 1,
                 lambda: measure_ours_one_core(corpus, length, preds, seconds)),
                ("google create_pretraining_data (Python)", 1,
                 lambda: measure_google(docs, tok.tokens, length, preds, seconds)),
                ("hf DataCollatorForLanguageModeling", 1,
                 lambda: measure_hf(docs, tok.path, length, seconds))]
    for name, used, fn in measures:
      rows.append({"pipeline": name, "L": length, "P": preds, "cores": used, "rate": fn()})
      print(f"{name:>42} L={length}: {rows[-1]['rate']:,.0f} examples/s", flush=True)
  result = table(rows)
  print(result)
  if not fv.smoke:
    harness.record(__name__, "Input pipeline", result,
                   command=harness.command("bench.peers.input_pipeline", argv[1:]),
                   machine=f"{machine()}. Corpus: {spec} ({corpus_summary(corpus)}). "
                           f"{seconds:g} s per measurement, batch 256.")
  return rows


def corpus_summary(corpus: dict) -> str:
  from input_pipeline import prepare  # pylint: disable=g-import-not-at-top
  s = prepare.load_summary(corpus["prepared"])
  return (f"{s['documents']:,} documents, {s['tokens']:,} tokens, vocabulary "
          f"{s['vocab']['vocab_size']:,} WordPiece")


if __name__ == "__main__":
  main(sys.argv)
