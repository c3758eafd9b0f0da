"""The ground floor of the data plane: errors, logging, paths and seeds (imports nothing of the project)."""
