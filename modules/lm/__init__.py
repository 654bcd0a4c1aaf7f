"""The LM modules of the method (DSPy signatures, demonstrations, modules) and the rules that check their outputs."""
