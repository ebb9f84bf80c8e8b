"""Music content: MIDI files to note tables (``midi``), fingerprints and melodies for dedupe,
music statistics (``stats``) and the split's similarity audit (``leakage``)."""
