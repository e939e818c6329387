"""The decoupled architecture: rollout worker processes and a learner joined by a trajectory channel and a
weight channel under a staleness bound η (see ``docs/architectures.md``). Entry point:
:func:`tandem.orchestration.decoupled.runtime.train_decoupled` (``tandem train`` dispatches to it when
``architecture.mode: decoupled``)."""
