"""The descriptive sections of the report, one module each, every one a ``render(doc, ctx)``
(:mod:`pipeline.report.context`): ``data_card``, ``models``, ``metrics_table``, ``training_seeds``,
``nll_distributions``, ``conditioning``, ``memorisation``, ``music``, ``samples``,
``environment``; ``common`` holds what several share."""
