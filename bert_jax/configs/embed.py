r"""Contrastive fine-tuning into an embedding model (sentence embeddings, retrieval).

  python -m bert_jax.main --config=configs/embed.py --config.init_checkpoint=DIR \
      --config.train_file=pairs.jsonl \
      --config.eval_file=glue_data/STS-B/dev.tsv --workdir=/tmp/embed

Training pairs: one (anchor, positive) a record, optionally hard negatives (JSON Lines,
CSV / TSV with a header, or Parquet). The loss is InfoNCE with in-batch negatives over the
whole global batch (every device's rows; bert_jax/contrastive.py). Dev: STS-B's dev.tsv
(scored pairs: Spearman of cosine similarity, x100) or held-out pairs (MRR@10 of each
anchor's positive among all dev positives), and with `beir_dir` retrieval on a BEIR-layout
directory (nDCG@10, which then picks best/); best/ keeps the best epoch and is what
`predict --mode=embed` and `convert --to=sentence_transformers` read.
"""
import ml_collections

from bert_jax.configs import finetune


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = finetune.get_config()
  c.task = "embed"
  c.train_file = ""  # full paths
  c.eval_file = ""
  c.anchor_column = "anchor"  # the training file's columns
  c.positive_column = "positive"
  c.negative_columns = ""  # hard negatives, comma-separated columns ("" = in-batch only)
  # The dev file's columns ("" = the training file's); STS-B: sentence1, sentence2, score.
  c.eval_anchor_column = "sentence1"
  c.eval_positive_column = "sentence2"
  # When the dev file has it: Spearman picks best/, else MRR@10 ("" = unscored; a dev file
  # without it whose other columns hold numbers is refused, naming them).
  c.score_column = "score"
  # A BEIR-layout directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) searched after
  # every epoch: beir_ndcg@10, beir_recall@100, beir_mrr@10 among the dev metrics. "" = none.
  c.beir_dir = ""
  c.beir_split = "dev"
  # The dev metric that picks best/ ("" = beir_ndcg@10 with beir_dir, else spearman with
  # scored dev pairs, else mrr@10).
  c.best_metric = ""
  c.pooling = "mean"  # mean | cls | last (the token vectors -> one vector a text)
  c.normalize = True  # the exported model L2-normalises (the loss uses cosine either way)
  c.scale = 20.0  # cosine similarity x scale = logits (1 / temperature)
  c.symmetric = False  # also each positive towards its own anchor among the batch's anchors
  # Matryoshka: "768,256,64" trains the vectors' first 768, 256 and 64 components each as an
  # embedding (the losses summed), so that truncated vectors work too. "" = off.
  c.matryoshka_dims = ""
  # The gradient cache: > 0 encodes a batch's texts (rows x (2 + hard negatives)) this many
  # at a time, the forward pass keeping only their vectors and the backward pass encoding
  # each chunk again: a batch of thousands of pairs in the memory of a chunk, the same loss
  # and gradients (bert_jax/contrastive.py). It must divide the batch's texts (with packing:
  # a chunk counts rows, and the batch's rows are made a multiple of it). 0: off.
  c.grad_cache_chunk = 0
  # Packing: each batch's texts share rows of max_seq_length tokens, up to
  # max_examples_per_row a row (attention inside each text, positions restarting), so short
  # texts cost little padding; the loss and its gradients are those of one text a row. A
  # batch still holds global_batch_size pairs; its rows are the most any batch of the run
  # needs, counted when it starts. Evaluation stays unpacked.
  c.packing = False
  c.max_examples_per_row = 8
  # No text (anchor, positive or hard negative) twice in a batch, as sentence-transformers'
  # NoDuplicatesBatchSampler: a pair repeated, or an anchor with several positives, would
  # score its own positive as a negative. A pair that would repeat a text waits for a later
  # batch; the pairs moved and dropped are counted in the log. False: batches as shuffled.
  c.no_duplicates = True
  c.max_seq_length = 128
  c.global_batch_size = 64  # each anchor's negatives: the other 63 positives (and negatives)
  c.num_epochs = 1
  c.opt.learning_rate = 2e-5
  return c
