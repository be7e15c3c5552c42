"""Llama-family model code: config, layers, reference attention, loaders and the GGUF import."""
