"""symkit pipeline: one module per DVC stage, each with a typed ``run`` and a thin CLI."""

__version__ = "0.1.0"
