"""models.base: the sequence-model protocol (what evaluation, generation and the audit rely on)
and the padded target id."""

from __future__ import annotations

import inspect

import numpy as np
import torch.nn.functional as F

from models.base import IGNORE_INDEX, SequenceModel
from models.checks import check_sequence_model, sample_sequences


class Uniform:
    """The smallest model the protocol describes: every id but BOS equally likely."""

    def __init__(self, vocab_size: int = 10, bos_id: int = 8, eos_id: int = 9) -> None:
        self.vocab_size, self.bos_id, self.eos_id = vocab_size, bos_id, eos_id

    def next_logprobs(self, contexts):
        row = np.full(self.vocab_size, -np.log(self.vocab_size - 1))
        row[self.bos_id] = -np.inf
        return np.tile(row, (len(contexts), 1))

    def token_nll(self, seqs):
        return [np.full(len(s) + 1, np.log(self.vocab_size - 1)) for s in seqs]


def test_the_padded_target_is_torch_s_ignored_index():
    default = inspect.signature(F.cross_entropy).parameters["ignore_index"].default
    assert IGNORE_INDEX == default == -100


def test_a_model_with_the_two_attributes_and_methods_is_a_sequence_model():
    model = Uniform()
    assert isinstance(model, SequenceModel)
    assert check_sequence_model(Uniform, sample_sequences(range(8))) == [
        "check_attributes", "check_token_nll", "check_next_logprobs", "check_chain_rule",
        "check_deterministic"]


def test_a_model_missing_a_member_is_not_one():
    class NoLogprobs:
        vocab_size, eos_id = 10, 9

        def token_nll(self, seqs):
            return []

    class NoEos(Uniform):
        def __init__(self) -> None:
            self.vocab_size = 10

    assert not isinstance(NoLogprobs(), SequenceModel)
    assert not isinstance(NoEos(), SequenceModel)
