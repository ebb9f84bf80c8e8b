"""The report's words: its first screen (``headline``), what its sections read (``context``),
its sections (``sections``) and the document of ``symkit compare`` (``compare_document``)."""
