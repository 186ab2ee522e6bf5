"""tf-transformer: a TensorFlow 2 / Keras port of the original TF1 Transformer for translation.

Modules, one per concern, named after the original code:

* :mod:`tf_transformer.modules`: the blog's layers (``multihead_attention`` ...).
* :mod:`tf_transformer.model`: the encoder-decoder, its loss and accuracy.
* :mod:`tf_transformer.hparams`: hyper-parameters from ``hparams.yaml``.
* :mod:`tf_transformer.vocab`, :mod:`tf_transformer.tokenizer`: words and subwords to ids, as graph ops.
* :mod:`tf_transformer.corpus`, :mod:`tf_transformer.data_load`: reading corpora, length-bucketed batches.
* :mod:`tf_transformer.training`, :mod:`tf_transformer.checkpoints`: the compiled step, precision,
  distribution strategies; checkpoints that survive a kill.
* :mod:`tf_transformer.trainer`: a training run, of :mod:`tf_transformer.step_loop` (the steps) and
  :mod:`tf_transformer.evaluator` (dev and test scoring, samples, the best checkpoint).
* :mod:`tf_transformer.evaluation`, :mod:`tf_transformer.summaries`, :mod:`tf_transformer.progress`,
  :mod:`tf_transformer.plotting`: BLEU/chrF, TensorBoard (and the curves read back), the progress bar, figures.
* :mod:`tf_transformer.model_files`, :mod:`tf_transformer.average`: what a model directory holds and
  reading it back; checkpoint averaging.
* :mod:`tf_transformer.decoding`, :mod:`tf_transformer.translation`: greedy (cached and uncached) and beam
  search; translating batches of sentences, attention pictures.
* :mod:`tf_transformer.export`, :mod:`tf_transformer.serving`: the SavedModel for TF Serving and its clients.
* :mod:`tf_transformer.cli`: the command lines (``train.py`` and ``translate.py`` run two of them); nothing
  else imports them.
"""

__version__ = "0.1.0"
