"""Scoring and model loading: the protocol's token rules (``protocol``), loading trained models
(``loading``), the group bootstrap, sampling and memorisation measures."""
