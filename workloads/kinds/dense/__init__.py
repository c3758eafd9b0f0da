"""The dense kind: a bi-encoder trained contrastively (DPR / SimCSE / DiffCSE), its first stage and index."""
