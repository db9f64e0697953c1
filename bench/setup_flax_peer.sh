#!/usr/bin/env bash
# Builds the venv for the HuggingFace Flax peer of bench/peers/flax_peer.py:
#
#   bash bench/setup_flax_peer.sh [VENV_DIR]      # default /tmp/flaxpeer_venv
#
# transformers 4.57.x is the last line with Flax models (v5 removed them). Its
# "flax" extra pins jax/jaxlib <= 0.4.13 and flax <= 0.7.0, the versions its Flax
# BERT was tested with; jaxlib 0.4.13 is built against numpy 1.x and imports
# scipy.linalg functions that scipy 1.13 removed, hence the numpy/scipy pins.
set -euo pipefail
VENV="${1:-/tmp/flaxpeer_venv}"
PY="${PYTHON:-python3.11}"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet \
  "transformers==4.57.6" "jax==0.4.13" "jaxlib==0.4.13" "flax==0.7.0" "optax==0.1.7" \
  "chex==0.1.82" "orbax-checkpoint==0.2.3" "numpy<2" "scipy<1.13" "ml_dtypes<0.3"
"$VENV/bin/python" - <<'EOF'
import jax, flax, optax, transformers
from transformers import FlaxBertForPreTraining  # noqa: F401  (fails here if Flax is unusable)
print("flax peer venv ok:", "jax", jax.__version__, "flax", flax.__version__,
      "optax", optax.__version__, "transformers", transformers.__version__)
EOF
