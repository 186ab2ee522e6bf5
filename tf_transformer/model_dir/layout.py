"""The names in a model directory, free of TensorFlow (the command lines' ``--help`` names them before
TensorFlow's import)::

  MODEL_DIR/
    hparams.yaml          resolved hyper-parameters (flat; `--config` reads it)
    sentencepiece.model   the joint subword model (tokenizer: sentencepiece), or
    source.vocab.tsv      the source vocabulary, one `word<TAB>count` per id, and
    target.vocab.tsv      the target vocabulary (tokenizer: word)
    checkpoint, ckpt-N.*  tf.train.CheckpointManager files, N = the training step
                          (tf_transformer.train.checkpoints: weights, optimizer, data position)
    best/                 the checkpoint with the best dev BLEU, and best.yaml (its scores)
    average/              the average of the last checkpoints (tf_transformer.train.average), itself a model
                          directory: translate.py --model-dir MODEL_DIR/average reads it
    samples-stepN.txt     dev translations at step N
    logs/                 TensorBoard event files
    curves.png            the training curves: loss, learning rate, dev BLEU (tf_transformer.train.summaries)
    export/<version>/     the SavedModel for TF Serving (tf_transformer.infer.export)
    previous-TIME/        what `train.py --restart` set aside
    .lock                 held by the process writing here (tf_transformer.locks)

Every file is written atomically, so a killed run leaves the previous version. Writing and reading the run
files: :mod:`tf_transformer.model_dir.run_files`.
"""

HPARAMS_FILE = "hparams.yaml"
SENTENCEPIECE_FILE = "sentencepiece.model"
SOURCE_VOCAB_FILE = "source.vocab.tsv"
TARGET_VOCAB_FILE = "target.vocab.tsv"
BEST_DIR = "best"
AVERAGE_DIR = "average"
LOG_DIR = "logs"
CURVES_FILE = "curves.png"
EXPORT_SUBDIR = "export"
PREVIOUS_PREFIX = "previous-"
