"""The deterministic retriever core: the hypergraph, the vector indexes and the HypergraphRetriever (no LM, no I/O)."""
