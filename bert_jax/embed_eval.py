r"""How good an embedding model is: STS-B Spearman of cosine similarity (GLUE's STS-B files)
and retrieval nDCG@10 / Recall@100 / MRR@10 on a BEIR-layout directory (corpus.jsonl,
queries.jsonl, qrels/<split>.tsv) by exact search, the corpus read and scored in chunks so
that memory stays flat in its size.

    python -m bert_jax.embed_eval --checkpoint=DIR [--sts_file=glue_data/STS-B/dev.tsv] \
        [--beir_dir=scifact --split=test] [--truncate_dim=256]

`--checkpoint`: a sentence-transformers directory, a contrastive fine-tuning workdir (its
best/), or any checkpoint predict reads (mean pooling unless --pooling says otherwise).

    scores = embed_eval.sts(cfg, params, tokenizer, spec, glue.read_glue("stsb", dir, "dev"))
    scores = embed_eval.retrieval(cfg, params, tokenizer, spec, beir_dir, split="test")
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from typing import Any, Iterator, Sequence

from absl import flags
import numpy as np

from bert_jax import embed
from bert_jax import loader
from bert_jax import scoring
from common import errors
from common import fileio
from input_pipeline import glue
from input_pipeline import text as text_lib
from input_pipeline.tokenizer import Tokenizer

NDCG_AT, RECALL_AT, MRR_AT = 10, 100, 10


class RetrievalDataError(errors.UserError, ValueError):
  """A BEIR-layout directory that cannot be evaluated: the message names the file and row."""


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def sts(cfg: Any, params: Any, tokenizer, spec: embed.Spec, examples: Sequence[glue.Example],
        batch_size: int = 32) -> dict[str, float]:
  """Spearman and Pearson correlation (x100, as GLUE reports) between the gold scores and the
  cosine similarity of each pair's two embeddings."""
  a = embed.embed_texts(cfg, params, tokenizer, (e.text_a for e in examples), spec, batch_size)
  b = embed.embed_texts(cfg, params, tokenizer, (e.text_b or "" for e in examples), spec,
                        batch_size)
  cosine = np.sum(_unit(a) * _unit(b), axis=-1)
  gold = np.asarray([float(e.label) for e in examples])
  return {"spearman": 100 * scoring.spearman(cosine, gold),
          "pearson": 100 * scoring.pearson(cosine, gold)}


# ---- BEIR layout --------------------------------------------------------------------------

def _jsonl(path: str, fields: tuple[str, ...]) -> Iterator[tuple[int, dict]]:
  """(line number, record) of each non-blank line; a line that is not a JSON object with
  `fields` is a RetrievalDataError naming the file and line."""
  with fileio.path(path).open("r") as f:
    for n, record in text_lib.json_objects(f, path, RetrievalDataError):
      missing = [k for k in fields if k not in record]
      if missing:
        raise RetrievalDataError(f"{path}:{n}: no {', '.join(map(repr, missing))} field (a BEIR "
                                 f"line holds {', '.join(fields)}).")
      yield n, record


def _doc_text(record: dict) -> str:
  title = str(record.get("title") or "").strip()
  return f"{title} {record['text']}".strip() if title else str(record["text"])


def read_qrels(path: str) -> dict[str, dict[str, int]]:
  """qrels/<split>.tsv (query-id, corpus-id, score; a header line) -> {query: {doc: score}}."""
  file = fileio.path(path)
  if not file.exists():
    qrels = file.parent
    found = sorted(p.name for p in qrels.glob("*.tsv")) if qrels.exists() else []
    raise RetrievalDataError(f"{path} does not exist: a BEIR directory holds its relevance "
                             f"judgements in qrels/<split>.tsv"
                             + (f" (found: {', '.join(found)})." if found else "; none found."))
  qrels: dict[str, dict[str, int]] = {}
  with file.open("r") as f:
    for n, line in enumerate(f, 1):
      cols = line.rstrip("\r\n").split("\t")
      if n == 1 and cols[:2] == ["query-id", "corpus-id"] or not line.strip():
        continue
      try:
        query, doc, score = cols[0], cols[1], int(float(cols[2]))
      except (IndexError, ValueError):
        raise RetrievalDataError(f"{path}:{n}: expected query-id<TAB>corpus-id<TAB>score, got "
                                 f"{line.strip()[:80]!r}.") from None
      qrels.setdefault(query, {})[doc] = score
  if not qrels:
    raise RetrievalDataError(f"{path} holds no judgements.")
  return qrels


def _top_k(scores_QC: np.ndarray, ids: list[str], best: tuple[np.ndarray, np.ndarray] | None,
           k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k best (score, doc id) of each query over the chunk and what was best before."""
  chunk_ids = np.broadcast_to(np.asarray(ids, dtype=object), scores_QC.shape)
  if best is not None:
    scores_QC = np.concatenate([best[0], scores_QC], axis=1)
    chunk_ids = np.concatenate([best[1], chunk_ids], axis=1)
  keep = np.argsort(-scores_QC, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores_QC, keep, 1), np.take_along_axis(chunk_ids, keep, 1)


def search(cfg: Any, params: Any, tokenizer, spec: embed.Spec, queries: list[str],
           corpus: Iterator[tuple[str, str]], k: int = RECALL_AT, chunk: int = 4096,
           batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """Exact search: (scores [Q, k], doc ids [Q, k]) of each query's k most similar documents
  (the spec's similarity), the corpus embedded and scored `chunk` documents at a time."""
  q = embed.embed_texts(cfg, params, tokenizer, queries, spec, batch_size)
  if spec.similarity == "cosine":
    q = _unit(q)
  best = None
  while docs := list(itertools.islice(corpus, chunk)):
    d = embed.embed_texts(cfg, params, tokenizer, (t for _, t in docs), spec, batch_size)
    if spec.similarity == "cosine":
      d = _unit(d)
    best = _top_k(q @ d.T, [i for i, _ in docs], best, k)
  if best is None:
    raise RetrievalDataError("the corpus holds no documents.")
  return best


def metrics(ranked: np.ndarray, qrels: dict[str, dict[str, int]], query_ids: list[str]
            ) -> dict[str, float]:
  """nDCG@10 (linear gain, as trec_eval), Recall@100 and MRR@10, x100, averaged over the
  queries, from each query's ranked doc ids."""
  ndcg, recall, mrr = [], [], []
  for query, docs in zip(query_ids, ranked):
    judged = qrels[query]
    gains = [judged.get(d, 0) for d in docs]
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:NDCG_AT]) if g > 0)
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal[:NDCG_AT]))
    ndcg.append(dcg / idcg if idcg else 0.0)
    relevant = sum(1 for g in judged.values() if g > 0)
    recall.append(sum(1 for g in gains[:RECALL_AT] if g > 0) / relevant if relevant else 0.0)
    first = next((i for i, g in enumerate(gains[:MRR_AT]) if g > 0), None)
    mrr.append(0.0 if first is None else 1.0 / (first + 1))
  return {f"ndcg@{NDCG_AT}": 100 * float(np.mean(ndcg)),
          f"recall@{RECALL_AT}": 100 * float(np.mean(recall)),
          f"mrr@{MRR_AT}": 100 * float(np.mean(mrr))}


def _corpus_ids(path: str) -> set[str]:
  """The _id of every document of corpus.jsonl (the ids alone are held, not the texts); an
  _id on more than one line is a RetrievalDataError naming the first repeat and how many
  ids repeat (a document found twice would count twice: recall above 100%)."""
  ids, repeated, first = set(), set(), None
  for n, record in _jsonl(path, ("_id", "text")):
    doc = str(record["_id"])
    if doc in ids:
      first = first or (n, doc)
      repeated.add(doc)
    ids.add(doc)
  if repeated:
    raise RetrievalDataError(
        f"{path}:{first[0]}: _id {first[1]!r} (and {len(repeated) - 1} more) is repeated: each "
        "document needs its own _id (else it is found, and counted, more than once); remove "
        "the repeated lines or give them ids of their own.")
  return ids


def read_queries(path: str, split: str = "test"
                 ) -> tuple[dict[str, dict[str, int]], list[str], list[str]]:
  """(qrels, query ids, their texts) of the BEIR-layout directory `path`: the judged queries of
  qrels/<split>.tsv, each of which must be in queries.jsonl, and their judged documents, each
  of which must be in corpus.jsonl, whose ids must not repeat (else a RetrievalDataError
  naming the first and the count). Read before any training, so that bad input costs
  nothing (corpus.jsonl is read through once for its ids)."""
  root = fileio.path(path)
  qrels = read_qrels(str(root / "qrels" / f"{split}.tsv"))
  for name in ("corpus.jsonl", "queries.jsonl"):
    if not (root / name).exists():
      raise RetrievalDataError(f"{root / name} does not exist: a BEIR directory holds "
                               "corpus.jsonl, queries.jsonl and qrels/<split>.tsv.")
  texts = {str(r["_id"]): str(r["text"])
           for _, r in _jsonl(str(root / "queries.jsonl"), ("_id", "text"))
           if str(r["_id"]) in qrels}
  missing = [q for q in qrels if q not in texts]
  if missing:
    raise RetrievalDataError(f"{root / 'qrels' / (split + '.tsv')}: query {missing[0]!r} "
                             f"(and {len(missing) - 1} more) is not in {root / 'queries.jsonl'}.")
  corpus = _corpus_ids(str(root / "corpus.jsonl"))
  unknown = list(dict.fromkeys(d for judged in qrels.values() for d in judged if d not in corpus))
  if unknown:
    raise RetrievalDataError(
        f"{root / 'qrels' / (split + '.tsv')}: corpus id {unknown[0]!r} (and {len(unknown) - 1} "
        f"more) is not in {root / 'corpus.jsonl'}: a judged document missing from the corpus is "
        "never found; add it to corpus.jsonl or remove its lines from the qrels.")
  query_ids = list(qrels)
  return qrels, query_ids, [texts[q] for q in query_ids]


def retrieval(cfg: Any, params: Any, tokenizer, spec: embed.Spec, path: str,
              split: str = "test", chunk: int = 4096, batch_size: int = 32,
              queries: tuple | None = None) -> dict[str, float]:
  """The retrieval metrics of the model on the BEIR-layout directory `path`: the queries of
  qrels/<split>.tsv (`queries`: read_queries' result, if read already) against every document
  of corpus.jsonl."""
  qrels, query_ids, texts = queries or read_queries(path, split)
  corpus = ((str(r["_id"]), _doc_text(r))
            for _, r in _jsonl(str(fileio.path(path) / "corpus.jsonl"), ("_id", "text")))
  _, ranked = search(cfg, params, tokenizer, spec, texts, corpus, chunk=chunk,
                     batch_size=batch_size)
  return metrics(ranked, qrels, query_ids)


def load(checkpoint: str, vocab: str | None = None, lowercase: bool | None = None,
         pooling: str | None = None, normalize: bool | None = None,
         max_seq_length: int | None = None, truncate_dim: int | None = None
         ) -> tuple[Any, Any, Any, embed.Spec]:
  """(model config, params, tokenizer, Spec) of an embedding model: the checkpoint's own
  spec (a sentence-transformers directory's, a task=embed run's) unless overridden."""
  spec = embed.read_spec(checkpoint) or embed.Spec()
  spec = embed.Spec(pooling or spec.pooling, spec.normalize if normalize is None else normalize,
                    max_seq_length or spec.max_seq_length, spec.similarity, truncate_dim)
  model_dir = embed.transformer_dir(checkpoint)
  cfg, params = loader.read(model_dir, "encoder", require_mlm=False)
  tokenizer = Tokenizer.from_path(vocab or loader.checkpoint_vocab(model_dir), lowercase)
  return cfg.replace(scan_layers=False, remat="none"), params, tokenizer, spec


def _flags():
  fv = flags.FlagValues()
  flags.DEFINE_string("checkpoint", None, "The embedding model (see the module doc).",
                      flag_values=fv)
  flags.DEFINE_string("vocab", None, "Its vocabulary (default: the checkpoint's own).",
                      flag_values=fv)
  flags.DEFINE_string("sts_file", None, "STS-B's dev.tsv (GLUE's layout): Spearman / Pearson "
                      "of cosine similarity, x100.", flag_values=fv)
  flags.DEFINE_string("beir_dir", None, "A BEIR-layout directory: nDCG@10, Recall@100, MRR@10.",
                      flag_values=fv)
  flags.DEFINE_string("split", "test", "beir_dir: the qrels/<split>.tsv to score.",
                      flag_values=fv)
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "Override the checkpoint's pooling.",
                    flag_values=fv)
  flags.DEFINE_integer("max_seq_length", None, "Tokens a text (default: the checkpoint's).",
                       lower_bound=3, flag_values=fv)
  flags.DEFINE_integer("batch_size", 64, "Texts a forward pass.", lower_bound=1, flag_values=fv)
  flags.DEFINE_integer("truncate_dim", None, "Score the vectors' first N components only (a "
                       "Matryoshka model's smaller embedding).", lower_bound=1, flag_values=fv)
  return fv


@errors.reported
def main(argv: Sequence[str] | None = None) -> None:
  """`argv`: the flags (without the program name; default sys.argv[1:])."""
  args = _flags()
  errors.parse_flags(args, ["embed_eval"] + list(sys.argv[1:] if argv is None else argv), __doc__)
  errors.require_flags(args, "checkpoint")
  if not (args.sts_file or args.beir_dir):
    raise errors.UserError("Give --sts_file and/or --beir_dir: what to evaluate on.")
  cfg, params, tok, spec = load(args.checkpoint, args.vocab, pooling=args.pooling,
                                max_seq_length=args.max_seq_length, truncate_dim=args.truncate_dim)
  result: dict[str, Any] = {"checkpoint": args.checkpoint, "pooling": spec.pooling,
                            "dim": embed.dim(cfg, spec)}
  if args.sts_file:
    result["sts"] = sts(cfg, params, tok, spec, glue.read_glue_file("stsb", args.sts_file, "dev"),
                        args.batch_size)
  if args.beir_dir:
    result["retrieval"] = retrieval(cfg, params, tok, spec, args.beir_dir, args.split,
                                    batch_size=args.batch_size)
  print(json.dumps(result))


if __name__ == "__main__":
  main()
