"""Text utilities every plane shares: tokens (lexical scorers, selectors), sentences (the
splitter whose version keys everything computed from sentences) and GloVe vectors."""
