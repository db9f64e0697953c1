"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax."""
import os

# TensorFlow (data and summaries only) logs its C++ start-up notes (oneDNN, absl
# initialisation) at INFO on every run: keep warnings and errors only, unless the user
# asks for more with TF_CPP_MIN_LOG_LEVEL=0.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
