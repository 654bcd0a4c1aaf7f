"""Deterministic and LM building blocks: facts, hypergraph, vector search, retriever."""
