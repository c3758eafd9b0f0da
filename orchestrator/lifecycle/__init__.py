"""The one trial lifecycle of every kind, for ``orchestrate run``, required trials and sweeps.

- :mod:`~orchestrator.lifecycle.run`: :func:`~orchestrator.lifecycle.run.run_trial` walks the
  steps of :func:`workloads.kinds.run_steps` (requirements -> prepare -> train -> choose the
  epoch -> test every target -> keep -> log) on Ray, tracked in the run store; the chosen
  epoch and the training summary; a trial's outcome, read from its run (``TrialResult``);
- :mod:`~orchestrator.lifecycle.targets`: where a chosen checkpoint is tested and how;
- :mod:`~orchestrator.lifecycle.identity`: a trial's key in the run store (``trial_key``), its
  data's identity, reuse;
- :mod:`~orchestrator.lifecycle.preparation`: what would stop a trial, asked of its kind, and
  every trial's data, built before any training (``orchestrate prepare``, and ``run`` and
  ``sweep`` before they train).
"""
