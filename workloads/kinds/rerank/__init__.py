"""The re-ranking trial kind: a cross-encoder fine-tuned on a first stage's candidates."""
