"""DVC stages: one module per stage in ``dvc.yaml``, named like it.

Each module has a config model (unless a library owns it), a ``run(cfg, ...)`` that does the work,
a ``HELP`` line and ``add_arguments``/``main`` for ``symkit <stage>``. Stages import libraries and
never import each other (import-linter's ``stages`` contract in ``pyproject.toml``).
"""
