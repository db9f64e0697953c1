#!/usr/bin/env bash
# Builds the venv for the KerasHub peer of bench/peers/keras_peer.py and bench/peers/finetune_step.py:
#
#   bash bench/setup_keras_peer.sh [VENV_DIR]      # default /tmp/keraspeer_venv
#
# keras-hub 0.32 (Google's maintained BERT for Keras 3) on the JAX backend, with the
# same jax/jaxlib as bert_jax's constraints.txt, so both run on the same XLA. keras-hub
# needs tensorflow-text, which pulls the full tensorflow (beside bert_jax's
# tensorflow-cpu they would clash): hence a venv of its own, never the base install.
set -euo pipefail
VENV="${1:-/tmp/keraspeer_venv}"
PY="${PYTHON:-python3.11}"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet \
  "keras-hub==0.32.0" "keras==3.15.1" "jax==0.10.2" "jaxlib==0.10.2" "numpy==2.4.6"
KERAS_BACKEND=jax TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" - <<'PYEOF'
import jax, keras, keras_hub
print("keras peer venv ok:", "keras-hub", keras_hub.__version__, "keras", keras.__version__,
      "backend", keras.backend.backend(), "jax", jax.__version__)
PYEOF
