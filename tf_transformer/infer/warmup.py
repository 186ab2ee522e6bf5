"""TF Serving's warm-up requests, written into every export: ``assets.extra/tf_serving_warmup_requests``.

A model server pays for each signature's first call: TensorFlow optimizes the signature's graph and
the functions of its decoding loops (Grappler) and builds their executors. README command 1's export
on the AVX2-only EPYC (2026-12-02), loaded into a ``Session`` as TF Serving loads it: a first request of
one sentence took 7.4-7.8 s through ``serving_default``, the next 40-44 ms (through the C loader,
``tools/c_loader``, Grappler was 5.9-6.0 s of that first call: the signature's graph and 22 functions of
its loops). TF Serving replays this file's requests (``--enable_model_warmup``, on by default) while it
loads a version, before the version serves: the first user's request does not pay for it (43-63 ms).

One request a decoding path a model server runs without flags (:func:`warmup_requests`): ``serving_default``,
``translate`` greedy and at the exported beam size, and ``score``, each with one short sentence
(:data:`WARMUP_SENTENCE`: words, so that it decodes). Not ``translate_xla``: it needs a server flag
(``--xla_cpu_compilation_enabled=true``) and a warm-up request that fails fails the version's load; and
XLA compiles it again for every batch shape anyway: warm it with requests of the shapes you expect.

The file is a TFRecord of ``tensorflow.serving.PredictionLog`` protos (TF Serving's format).
"""

import os
from typing import NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from tf_transformer.infer.serving import predict_request
from tf_transformer.infer.signatures import (BEAM_SIGNATURE, BEAM_SIZE, INPUTS, SCORE_SIGNATURE, SERVING_SIGNATURE,
                                             SOURCES, TARGETS)

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")  # where TF Serving looks, in a version
WARMUP_SENTENCE = "warm up"


class WarmupRequest(NamedTuple):
    """One request: the signature's name and its inputs by name (numpy arrays)."""
    signature: str
    inputs: dict


def warmup_requests(beam_size):
    """The :class:`WarmupRequest` list of an export whose default beam size is ``beam_size``."""
    sentence = np.array([WARMUP_SENTENCE.encode()], object)
    beams = sorted({1, int(beam_size)})
    return ([WarmupRequest(SERVING_SIGNATURE, {INPUTS: sentence})]
            + [WarmupRequest(BEAM_SIGNATURE, {INPUTS: sentence, BEAM_SIZE: np.int32(beam)}) for beam in beams]
            + [WarmupRequest(SCORE_SIGNATURE, {SOURCES: sentence, TARGETS: sentence})])


def write_warmup_requests(version_dir, requests):
    """Writes ``requests`` as ``version_dir/``:data:`WARMUP_FILE`; returns its path."""
    path = os.path.join(version_dir, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for request in requests:
            writer.write(_prediction_log(request).SerializeToString())
    return path


def read_warmup_requests(version_dir):
    """The :class:`WarmupRequest` list of an export's :data:`WARMUP_FILE`, as TF Serving reads it."""
    requests = []
    for record in tf.data.TFRecordDataset(os.path.join(version_dir, WARMUP_FILE)):
        predict = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        requests.append(WarmupRequest(predict.model_spec.signature_name,
                                      {name: tf.make_ndarray(value) for name, value in predict.inputs.items()}))
    return requests


def _prediction_log(request):
    predict = predict_request(request.signature, request.inputs)
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=predict))
