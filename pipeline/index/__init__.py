"""Corpus to index: reading documents and corpora, extracting facts, building, saving and changing the hypergraph index."""
