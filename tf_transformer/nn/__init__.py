"""The network: the blog's layers (:mod:`.modules`) and the encoder-decoder built from them (:mod:`.model`)."""
