"""The contract every symkit language model meets, so evaluation, generation and the audit can
treat an n-gram and a transformer alike.

Ids live in the tokenizer's id space (``data/tokens/info.json``: ``vocab_size``, ``bos_id``,
``eos_id``, ``pad_id``). Sequences passed in never contain BOS/EOS; models add them. See
``docs/artifacts.md`` (scoring protocol): a sequence ``x_1..x_n`` is scored as the n+1 targets
``x_1..x_n, EOS``, each exactly once, with BOS and as much left context as the model allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

IGNORE_INDEX = -100
"""Target id of padded positions (torch's ``cross_entropy`` default): never a loss term."""


@runtime_checkable
class SequenceModel(Protocol):
    vocab_size: int
    """Size of the output distribution (the tokenizer's vocabulary, EOS included)."""
    eos_id: int
    """Column of ``next_logprobs`` that means end of sequence."""

    def token_nll(self, seqs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Negative log-likelihood in nats of every target: ``len(seq) + 1`` values per sequence."""
        ...

    def next_logprobs(self, contexts: Sequence[np.ndarray]) -> np.ndarray:
        """``(B, vocab_size)`` natural-log next-token distribution per context (BOS implied)."""
        ...
