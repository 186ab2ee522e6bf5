"""The data: corpora on disk (:mod:`.corpus`, the files in ``corpora/``), vocabularies (:mod:`.vocab`) and
tokenizers (:mod:`.tokenizer`), training batches (:mod:`.data_load`), token-id shards (:mod:`.shards`), and
the Debian corpus builder (:mod:`.datasets`)."""
