"""Building blocks of the ``train_transformer`` stage: data windows and batches (``data``),
resumable checkpoints (``checkpoint``) and the training loop (``loop``)."""
