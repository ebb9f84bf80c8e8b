"""Building blocks of the ``train_transformer`` stage: the ``transformer`` params section
(``config``), data windows and batches (``data``), where a process trains (``device``), the model,
optimiser and schedule (``setup``), resumable checkpoints (``checkpoint``, ``resume``), the
training loop (``loop``), what the stage writes (``outputs``) and synthetic token tables for the
doctor, tests and benchmark (``synthetic``)."""
