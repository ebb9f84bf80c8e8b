"""Adaptation experiments: a model pretrained on one corpus, adapted to another (the arms)."""
