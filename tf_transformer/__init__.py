"""tf-transformer: a TensorFlow 2 / Keras port of the original TF1 Transformer for translation.

Modules, one per concern, named after the original code:

* :mod:`tf_transformer.modules`: the blog's layers (``multihead_attention`` ...).
* :mod:`tf_transformer.model`: the encoder-decoder, its loss and accuracy.
* :mod:`tf_transformer.hparams`: hyper-parameters from ``hparams.yaml``.
* :mod:`tf_transformer.vocab`, :mod:`tf_transformer.data_load`: text to ids, batches.
* :mod:`tf_transformer.decoding`: greedy decoding.
* :mod:`tf_transformer.train`, :mod:`tf_transformer.translate`: the entry points.
"""

__version__ = "0.1.0"
