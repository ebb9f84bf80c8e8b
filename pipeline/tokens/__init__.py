"""The token contract (``contract``: info.json, table schemas, special ids), tokenizers
(``tokenizer``), the per-file encoding cache (``cache``) and the Python dataset API
(``dataset``)."""
