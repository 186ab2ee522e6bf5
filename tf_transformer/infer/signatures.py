"""The export's signatures and their tensors' names: the contract between the SavedModel
(:mod:`tf_transformer.infer.export`) and its clients (:mod:`tf_transformer.infer.serving`, TF Serving's REST and
gRPC requests), free of TensorFlow (``python -m tf_transformer.cli.export --help`` names them)."""

SERVING_SIGNATURE, BEAM_SIGNATURE, XLA_SIGNATURE = "serving_default", "translate", "translate_xla"
INPUTS, BEAM_SIZE, TRANSLATIONS, SCORES = "inputs", "beam_size", "translations", "scores"
SCORE_SIGNATURE, SOURCES, TARGETS, LOG_PROBS, TOKENS = "score", "sources", "targets", "log_probs", "tokens"
