"""The model families, one module each with its HuggingFace format beside it: BERT
(bert.py, bert_formats.py), ModernBERT / EuroBERT (modern.py, modern_formats.py), RoBERTa / XLM-R
(roberta.py), ELECTRA (electra.py), DeBERTa-v3 (deberta.py). What they share: layers.py
(the config base, dropout, attention biases, row gathers), bert_attention.py (BERT's fused
and flash attention paths), modern_attention.py (rotary embedding, banded / global / splash
/ flash attention); bert_tf_checkpoint.py reads Google's TF checkpoints.
bert_jax/families.py finds them by name; the checkpoint helpers every family's format shares
are bert_jax/formats.py's."""
