"""Commands beside the stages, which no DVC stage runs (``preregister``, ``compare``, ``doctor``,
``estimate``, ``check-deps`` ...): each module with a ``HELP`` line is ``symkit <its name>``."""
