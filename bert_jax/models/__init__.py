"""The model families, one module each with its HuggingFace format beside it: BERT
(bert.py; its format is bert_jax/formats.py, which also holds the tensor helpers every
family shares), ModernBERT / EuroBERT (modern.py, modern_formats.py), RoBERTa / XLM-R
(roberta.py), ELECTRA (electra.py), DeBERTa-v3 (deberta.py). bert_jax/families.py finds
them by name."""
