"""tf-transformer: a TensorFlow 2 / Keras port of the original TF1 Transformer for translation.

Modules, one per concern, named after the original code:

* :mod:`tf_transformer.modules`: the blog's layers (``multihead_attention`` ...).
* :mod:`tf_transformer.model`: the encoder-decoder, its loss and accuracy.
* :mod:`tf_transformer.hparams`: hyper-parameters from ``hparams.yaml``.
* :mod:`tf_transformer.vocab`, :mod:`tf_transformer.tokenizer`: words and subwords to ids, as graph ops.
* :mod:`tf_transformer.corpus`, :mod:`tf_transformer.data_load`: reading corpora, length-bucketed batches.
* :mod:`tf_transformer.training`, :mod:`tf_transformer.checkpoints`: the compiled step, precision,
  distribution strategies; checkpoints that survive a kill.
* :mod:`tf_transformer.evaluation`, :mod:`tf_transformer.summaries`, :mod:`tf_transformer.progress`,
  :mod:`tf_transformer.plotting`: BLEU/chrF, TensorBoard, the progress bar, attention plots.
* :mod:`tf_transformer.decoding`: greedy (cached and uncached) and beam search.
* :mod:`tf_transformer.export`, :mod:`tf_transformer.serving`: the SavedModel for TF Serving and its clients.
* :mod:`tf_transformer.train`, :mod:`tf_transformer.translate`: the entry points.
"""

__version__ = "0.1.0"
