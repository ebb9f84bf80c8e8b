"""Per-piece conditions: extraction from the notes and MIDI, the condition table, the vocabulary
of condition ids a model is given, adherence and diagnostics (docs/conditioning.md)."""
