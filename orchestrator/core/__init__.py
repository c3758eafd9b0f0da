"""The core of the control plane: configuration, the run-store schema, tracking, Ray execution, the trial lifecycle."""
