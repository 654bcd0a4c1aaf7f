"""Corpus -> index, configuration, embedder and the command line."""
