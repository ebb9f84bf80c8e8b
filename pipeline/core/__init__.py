"""Core I/O shared by every stage: params (``config``), atomic artifacts and their readers
(``artifacts``), split identity (``splits``), worker pools (``parallel``), progress bars."""
