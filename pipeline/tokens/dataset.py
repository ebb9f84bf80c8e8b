"""Python access to an experiment's tokens, for people who bring their own model.

```python
from pipeline.tokens.dataset import load_experiment

exp = load_experiment(".")                   # repo or DVC experiment root, after symkit tokenize
tok = exp.tokenizer                          # miditok tokenizer (data/tokenizer.json)
train = exp.dataset("train", seq_len=512)    # torch Dataset of windows
loader = torch.utils.data.DataLoader(train, batch_size=16, shuffle=True, collate_fn=exp.collate)
for input_ids, targets, attention_mask in loader: ...
```

Sequences are framed as ``BOS x_1 .. x_n EOS`` (the token table holds no BOS/EOS) and cut into
windows of ``seq_len + 1`` tokens every ``stride`` tokens; a window gives inputs ``w[:-1]`` and
targets ``w[1:]``. Padded positions have ``attention_mask`` 0 and target ``IGNORE_INDEX`` (-100,
torch's ``cross_entropy`` default), so PAD and BOS are never targets. torch is imported only
when a dataset is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.base import IGNORE_INDEX
from pipeline.core.artifacts import read_parquet
from pipeline.core.splits import SPLIT_NAMES
from pipeline.tokens.contract import TokenInfo, read_tokens, refuse_compound
from pipeline.tokens.tokenizer import load_tokenizer


def window_starts(length: int, seq_len: int, stride: int, pad: bool) -> list[int]:
    """Start offsets of the windows (``seq_len + 1`` tokens each) over a framed sequence.

    Every target position (1..length-1) is covered at least once when ``stride <= seq_len``.
    With ``pad`` the last, shorter window is kept (padded later); without it only full windows
    are kept, so a sequence shorter than ``seq_len + 1`` gives none.
    """
    if length < 2:
        return []
    full = list(range(0, max(0, length - seq_len - 1) + 1, stride)) \
        if length >= seq_len + 1 else []
    if not pad:
        return full
    if not full:
        return [0]
    nxt = full[-1] + stride
    if full[-1] + seq_len + 1 < length and nxt < length - 1:  # a tail of real targets is left
        full.append(nxt)
    return full


@dataclass
class Experiment:
    """An experiment's tokenizer, splits and token tables (paths relative to ``root``)."""

    root: Path
    tokenizer_path: Path = field(init=False)
    tokens_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.tokenizer_path = self.root / "data" / "tokenizer.json"
        self.tokens_dir = self.root / "data" / "tokens"

    @cached_property
    def info(self) -> TokenInfo:
        """``data/tokens/info.json``: vocab_size, pad/bos/eos ids, tokenizer and split hashes."""
        return TokenInfo.read(self.tokens_dir / "info.json")

    @cached_property
    def tokenizer(self) -> Any:
        """The miditok tokenizer the tokens were made with (never retrained)."""
        return load_tokenizer(self.tokenizer_path)

    @cached_property
    def splits(self) -> pd.DataFrame:
        """``data/splits.parquet``: sha256, group_id, split, fold."""
        return read_parquet(self.root / "data" / "splits.parquet")

    def tokens(self, split: str | None = None) -> pd.DataFrame:
        """Rows of ``tokens.parquet`` (train and val, or one of them); ``ids`` are int32 arrays.
        Test rows are refused here (see :func:`_check_split`)."""
        if split is not None:
            _check_split(split)
        return read_tokens(self.tokens_dir / "tokens.parquet",
                           splits=None if split is None else [split])

    def sequences(self, split: str, augmented: bool = False) -> list[np.ndarray]:
        """The split's non-empty id sequences in table order (plus augmentations for train).
        Compound tokens (CPWord, Octuple) are refused: they hold no single id stream."""
        refuse_compound(self.info, "the token dataset (pipeline.tokens.dataset)")
        seqs = [np.asarray(x, np.int64) for x in self.tokens(split)["ids"] if len(x)]
        if augmented:
            if split != "train":
                raise ValueError("augmented sequences exist for the train split only")
            aug = read_parquet(self.tokens_dir / "augmented.parquet", columns=["ids"])
            seqs += [np.asarray(x, np.int64) for x in aug["ids"] if len(x)]
        return seqs

    def dataset(self, split: str, seq_len: int = 512, stride: int | None = None,
                pad: bool = True, augmented: bool = False) -> Any:
        """A torch ``Dataset`` of (input_ids, targets, attention_mask) windows of ``split``."""
        info = self.info
        return token_windows(self.sequences(split, augmented), bos_id=info.bos_id,
                             eos_id=info.eos_id, pad_id=info.pad_id,
                             seq_len=seq_len, stride=stride or seq_len, pad=pad)

    @staticmethod
    def collate(batch: list[tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
        """Stack dataset items into (input_ids, targets, attention_mask), each (B, T)."""
        return collate(batch)


def load_experiment(root: Path | str = ".") -> Experiment:
    """Open an experiment folder after ``symkit tokenize`` (checks the token info exists)."""
    exp = Experiment(Path(root))
    exp.info  # noqa: B018 - a missing or corrupt info.json fails here, naming its stage
    return exp


def collate(batch: list[tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """Stack (input_ids, targets, attention_mask) items of equal length into (B, T) tensors."""
    import torch

    inputs, targets, masks = zip(*batch, strict=True)
    return torch.stack(inputs), torch.stack(targets), torch.stack(masks)


def _check_split(split: str) -> None:
    if split == "test":
        raise ValueError("split = 'test': scoring test pieces spends the test set; read them "
                         "with pipeline.decision.looks.test_tokens(command, tokens_path), which "
                         "records the look in reports/ledger.jsonl, or use `symkit evaluate`")
    if split not in SPLIT_NAMES:
        raise ValueError(f"split = {split!r}: use one of {', '.join(SPLIT_NAMES)}")


def token_windows(sequences: list[np.ndarray], *, bos_id: int, eos_id: int, pad_id: int,
                  seq_len: int, stride: int, pad: bool) -> Any:
    """Build the windowed torch ``Dataset`` (a function so torch is imported only here)."""
    import torch
    from torch.utils.data import Dataset

    if seq_len < 1 or stride < 1:
        raise ValueError(f"seq_len = {seq_len}, stride = {stride}: both must be >= 1")

    class _TokenWindows(Dataset):
        """Windows over ``BOS + ids + EOS``; item i -> (input_ids, targets, attention_mask)."""

        def __init__(self) -> None:
            self.framed = [np.concatenate([[bos_id], s, [eos_id]]).astype(np.int64)
                           for s in sequences]
            self.index = np.array([(i, st) for i, f in enumerate(self.framed)
                                   for st in window_starts(len(f), seq_len, stride, pad)],
                                  dtype=np.int64).reshape(-1, 2)

        def __len__(self) -> int:
            return len(self.index)

        def __getitem__(self, i: int) -> tuple[Any, Any, Any]:
            seq, start = self.index[i]
            w = self.framed[seq][start : start + seq_len + 1]
            n = len(w) - 1  # real (input, target) pairs in this window
            inputs = np.full(seq_len, pad_id, np.int64)
            targets = np.full(seq_len, IGNORE_INDEX, np.int64)
            mask = np.zeros(seq_len, np.int64)
            inputs[:n], targets[:n], mask[:n] = w[:-1], w[1:], 1
            return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(mask)

    return _TokenWindows()
