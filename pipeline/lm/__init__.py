"""The LM and its infrastructure: the session, the embedded local model, adapters, the call cache, record and profile, and Ray workers."""
