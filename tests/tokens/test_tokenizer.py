"""pipeline.tokens.tokenizer: miditok is imported without torch, and torch stays importable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_building_a_tokenizer_leaves_torch_unloaded_and_importable():
    out = run_python(
        "import sys\n"
        "from pipeline.tokens.tokenizer import make_tokenizer\n"
        "tok = make_tokenizer('REMI', {'use_programs': True})\n"
        "from miditok import TokSequence\n"
        "print('torch' in sys.modules, 'miditok.pytorch_data' in sys.modules)\n"
        "from miditok.pytorch_data import DatasetMIDI\n"  # the optional part still imports
        "import miditok.pytorch_data as pd\n"
        "print('torch' in sys.modules, pd.DatasetMIDI is DatasetMIDI, len(tok.vocab) > 100)\n")
    assert out.splitlines() == ["False False", "True True True"]


def test_plain_import_is_kept_when_torch_is_loaded():
    out = run_python(
        "import torch, sys\n"
        "from pipeline.tokens.tokenizer import import_miditok\n"
        "m = import_miditok()\n"
        "print(hasattr(m, 'pytorch_data'), m is sys.modules['miditok'])\n")
    assert out == "True True"


def test_a_miditok_that_needs_pytorch_data_is_imported_plainly(tmp_path):
    """A release whose __init__ does not catch the ImportError still imports (with torch)."""
    pkg = tmp_path / "miditok"
    (pkg / "pytorch_data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from miditok import pytorch_data\nVALUE = 1\n")
    (pkg / "pytorch_data" / "__init__.py").write_text("LOADED = True\n")
    out = run_python(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "from pipeline.tokens.tokenizer import import_miditok\n"
        "m = import_miditok()\n"
        "print(m.VALUE, m.pytorch_data.LOADED, m.__file__.startswith(sys.path[0]))\n")
    assert out == "1 True True"


def test_a_built_tokenizer_hashes_its_config_and_decodes_its_own_ids():
    """The hash follows the configuration; decode_ids gives back the notes of encoded ids, and a
    malformed sequence becomes a message, never an exception."""
    from symusic import Score

    from pipeline.tokens.tokenizer import decode_ids, make_tokenizer, tokenizer_hash

    tok = make_tokenizer("REMI", {})
    assert tokenizer_hash(tok) == tokenizer_hash(make_tokenizer("REMI", {}))
    assert tokenizer_hash(tok) != tokenizer_hash(make_tokenizer("TSD", {}))
    score = Score(str(Path(__file__).resolve().parents[1] / "fixtures/midi/mono_melody.mid"))
    seqs = tok.encode(score)
    ids = (seqs if not isinstance(seqs, list) else seqs[0]).ids
    decoded, error = decode_ids(tok, ids)
    assert error is None
    assert sum(len(tr.notes) for tr in decoded.tracks) == sum(len(tr.notes) for tr in score.tracks)
    empty, error = decode_ids(tok, [])
    assert error is None and sum(len(tr.notes) for tr in empty.tracks) == 0
    broken, error = decode_ids(tok, [len(tok) + 7])
    assert broken is None and error


# ------------------------------------------------------------------------------ compound tokens
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/midi"


@pytest.mark.parametrize("name", ["CPWord", "Octuple"])
def test_compound_steps_become_codes_and_decode_back(name):
    """A compound tokenizer's steps turn into one list per codebook and back exactly; decode_ids
    decodes the steps to the notes encoded; codebooks name each vocabulary with its size and
    its own special ids."""
    import numpy as np
    from symusic import Score

    from pipeline.tokens.tokenizer import (
        codebooks,
        codes_from_steps,
        decode_ids,
        is_compound,
        make_tokenizer,
        steps_from_codes,
    )

    tok = make_tokenizer(name, {"use_programs": True})
    books = codebooks(tok)
    assert is_compound(tok) and len(books) == len(tok.vocab) > 1
    assert [b["size"] for b in books] == [len(v) for v in tok.vocab]
    assert all((b["pad_id"], b["bos_id"], b["eos_id"]) == (v["PAD_None"], v["BOS_None"],
                                                           v["EOS_None"])
               for b, v in zip(books, tok.vocab, strict=True))
    assert "Pitch" in [b["name"] for b in books]
    # CPWord's Ignore_None (written where a step has no value) is listed, to be masked
    assert [b.get("ignore_id") for b in books] == [v.get("Ignore_None") for v in tok.vocab]
    assert any("ignore_id" in b for b in books) == (name == "CPWord")
    score = Score(str(FIXTURES / "four_voices.mid"))
    steps = tok.encode(score).ids
    codes = codes_from_steps(steps, len(books))
    assert codes.shape == (len(books), len(steps)) and codes.dtype == np.int32
    assert steps_from_codes(codes) == steps
    assert steps_from_codes([list(c) for c in codes]) == steps
    decoded, error = decode_ids(tok, steps)
    assert error is None
    assert decoded.note_num() == tok.preprocess_score(score).note_num() > 0
    assert decode_ids(tok, [])[1] is None
    with pytest.raises(ValueError, match=f"{len(books)} ids"):
        codes_from_steps([[4, 4]], len(books))
    assert codebooks(make_tokenizer("REMI", {})) == []


def test_max_bar_embedding_is_octuples_alone():
    from pipeline.tokens.tokenizer import make_tokenizer

    tok = make_tokenizer("Octuple", {"max_bar_embedding": 100})
    assert tok.config.additional_params["max_bar_embedding"] == 100
    assert len(tok.vocab[tok.vocab_types_idx["Bar"]]) == 100 + 4  # Bar_0..Bar_99, 4 specials
    with pytest.raises(ValueError, match=r"config\.max_bar_embedding: read by Octuple only"):
        make_tokenizer("REMI", {"max_bar_embedding": 100})
    with pytest.raises(ValueError, match=r"config\.max_bar_embedding = 0: must be a positive"):
        make_tokenizer("Octuple", {"max_bar_embedding": 0})
