"""The report's words: its first screen (``headline``), its sections (``sections``,
``conditioning_section``) and the document of ``symkit compare`` (``compare_document``)."""
