"""GGUF files: reading the header and tensors (`file`), mapping metadata to a Hugging Face
config (`config`) and tensor names/layouts to Hugging Face ones (`names`), and the converted
safetensors copy later loads read (`cache`). Modules import the third-party `gguf` package by
its absolute name, which this package (`models.gguf`) does not shadow.
"""
