"""llamadecide: a self-hosted decision endpoint on llama.cpp."""

__version__ = "0.1.0"
