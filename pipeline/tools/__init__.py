"""Commands beside the stages, which no DVC stage runs: ``preregister``, ``doctor``, ``estimate``,
``check-params`` and ``check-deps``."""
