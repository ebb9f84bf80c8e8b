"""Music content: MIDI files to note tables (``midi``, ``parsing``), hashing, parsing and
quarantining files (``ingestion``), and descriptive statistics of notes (``descriptors``)."""
