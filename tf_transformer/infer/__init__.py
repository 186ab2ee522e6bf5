"""Inference: a trained model read back (:mod:`.load`), decoding (:mod:`.decode`), translating sentences
(:mod:`.translate`), the SavedModel export (:mod:`.export`), its signatures' names (:mod:`.signatures`), its
warm-up requests (:mod:`.warmup`) and clients of TF Serving (:mod:`.serving`)."""
