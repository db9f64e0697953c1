r"""Base fine-tuning configuration (the paper's defaults); tasks override a few fields.

  python -m bert_jax.main --config=configs/glue.py:cola --config.init_checkpoint=DIR \
      --config.vocab_path=vocab.txt --config.data_dir=glue_data/CoLA --workdir=/tmp/cola

`init_checkpoint`: a pre-training workdir of ours, a `python -m bert_jax.convert`
export, a HuggingFace BERT directory or a Google TF checkpoint. Only the small output
layer is new; all parameters are fine-tuned.
"""
import ml_collections

from configs import default


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = default.get_config()
  c.task = "glue"  # glue | custom | squad | conll | swag (| pretrain)
  c.init_checkpoint = ""  # required: the pre-trained model
  c.vocab_path = ""  # vocab.txt / SentencePiece model (or a HuggingFace model dir) of the checkpoint
  # None: cased or uncased as the files beside the vocabulary say (a HuggingFace
  # tokenizer_config.json's do_lower_case, ...); True/False overrides them.
  c.lowercase = ml_collections.config_dict.placeholder(bool)
  c.data_dir = ""  # the task's files (GLUE: train.tsv, dev.tsv, ...); "tfds[:DIR]" = local TFDS glue/*
  c.tfds_name = ""  # with data_dir=tfds: the TFDS dataset ("" = glue/<glue_task>)
  c.glue_task = "cola"  # cola | sst2 | mrpc | stsb | qqp | mnli | qnli | rte | wnli
  c.eval_split = "dev"  # dev | dev_mismatched (MNLI)
  # custom classification / SQuAD / CoNLL / SWAG files (custom, squad: full paths;
  # conll, swag: names inside data_dir)
  c.train_file = ""
  c.eval_file = ""
  c.text_a_column = "text"  # custom: field names in the CSV/TSV header or JSONL records
  c.text_b_column = ""
  c.label_column = "label"
  c.labels = ()  # custom: label order; () = sorted labels of the training file
  c.tag_scheme = "iob2"  # conll: iob1 | iob2
  # SQuAD windows and decoding
  c.doc_stride = 128
  c.max_query_length = 64
  # Longest predicted span in tokens (BERT's 30). It cuts real answers: the SQuAD 2.0 dev set
  # has 6 gold answers of 31-43 tokens. The evaluation log counts the gold answers it cuts
  # (metrics: answers_over_max_length = questions left with no reachable gold answer).
  c.max_answer_length = 30
  c.n_best_size = 20
  c.version_2_with_negative = False
  c.null_score_threshold = 0.0  # v2.0: predict "" when null score - best span > this

  c.max_seq_length = 128
  c.global_batch_size = 32  # paper: 16 or 32
  c.eval_batch_size = 64
  c.num_epochs = 3  # paper: 2-4
  # Sequence packing (glue / custom classification only): each epoch's shuffled training
  # examples share rows of max_seq_length (block-diagonal attention, positions and [CLS]
  # per example), so short examples waste little compute on padding. global_batch_size
  # then counts rows of up to max_examples_per_row examples each (steps per epoch fall
  # accordingly; the loss still averages over examples). Evaluation stays unpacked.
  c.packing = False
  c.max_examples_per_row = 8
  c.warmup_fraction = 0.1  # paper: 10% linear warmup, then linear decay
  c.opt.learning_rate = 2e-5  # paper: 5e-5, 3e-5 or 2e-5
  c.opt.bias_correction = False
  c.model.dtype = "float32"
  c.model.hidden_dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.checkpoint_every_steps = 1000  # plus one at every epoch end
  c.keep_checkpoints = 2  # the newest N (the best parameters are kept apart, in best/)
  c.keep_checkpoint_period = 0
  c.log_every_steps = 50
  return c
