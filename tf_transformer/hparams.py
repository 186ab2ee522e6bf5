"""Hyper-parameters: one typed record, filled from ``hparams.yaml``.

Values are layered, later wins:

1. ``defaults`` in ``hparams.yaml`` (every key, commented there),
2. the chosen preset in ``presets`` (``default_preset`` when none is named),
3. ``--config FILE``: a flat YAML mapping of keys to values (the
   ``hparams.yaml`` that training writes into a model directory is one),
4. ``--set key=value`` on the command line.

Each layer is checked as it is applied, so an error names where the bad key or
value came from, and what would be valid. Reading the file and its presets' names:
:mod:`tf_transformer.presets`; the bounds of values: :mod:`tf_transformer.options` (both free of TensorFlow,
for the command lines' ``--help``).
"""

import dataclasses
import difflib
import math
import typing
from typing import Literal

import yaml

from tf_transformer.files import write_atomic
from tf_transformer.nn.model import TransformerConfig
from tf_transformer.options import (MAX_BEAM_PATIENCE, MAX_BEAM_SIZE, MAX_DECODE_LENGTH, MAX_INT32, MAX_LENGTH_FACTOR,
                                   MAX_SEED)
from tf_transformer.presets import PRESETS_PATH, HParamsError, preset_names, read_yaml  # noqa: F401 (0.1.0's name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HParams(TransformerConfig):
    """All hyper-parameters; ``hparams.yaml`` documents each one.

    The model's come first, from :class:`~tf_transformer.nn.model.TransformerConfig`.
    """

    # Vocabulary.
    tokenizer: Literal["word", "sentencepiece"]
    vocab_size: int
    min_count: int
    # Training.
    label_smoothing: float
    lr_schedule: Literal["constant", "noam", "linear", "cosine"]
    learning_rate: float
    warmup_steps: int
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    batch_tokens: int
    batch_size: int
    accumulate_steps: int
    pad_to_maxlen: bool
    input_pipeline: Literal["auto", "memory", "stream"]
    shard_pairs: int
    num_epochs: int
    seed: int
    clip_norm: float
    train_minutes: float
    # Speed.
    precision: Literal["float32", "mixed_bfloat16", "mixed_float16", "auto"]
    jit_compile: bool
    # Checkpoints and evaluation.
    save_every_steps: int
    keep_checkpoints: int
    eval_every_epochs: int
    average_last: int
    # Decoding.
    beam_size: int
    length_penalty: float
    max_decode_length: int
    max_length_factor: float
    beam_patience: float

    def to_dict(self):
        return dataclasses.asdict(self)

    def replace(self, **changes):
        """A copy with ``changes`` applied and checked like ``--set``."""
        values = self.to_dict()
        _apply(values, changes, "replace()")
        return _finish(values, "replace()")

    def save(self, path):
        """Writes a flat, complete YAML mapping atomically; ``--config`` reads it back."""
        write_atomic(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


FIELDS = {f.name: f for f in dataclasses.fields(HParams)}

# Keys that fix the weights (the model's, and the vocabulary's): a checkpoint only fits a
# model built with the same values.
ARCHITECTURE_KEYS = TransformerConfig.weight_names() + ("tokenizer", "vocab_size", "min_count")


def _describe(annotation):
    """A human phrase for what a field accepts."""
    choices = _choices(annotation)
    if choices is not None:
        return "one of " + ", ".join("null" if c is None else repr(c) for c in choices)
    return {int: "an integer", float: "a number", bool: "true or false"}[annotation]


def _choices(annotation):
    """The allowed values of a Literal/Optional[Literal] annotation, else None."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union:
        choices = []
        for arg in typing.get_args(annotation):
            choices += [None] if arg is type(None) else list(typing.get_args(arg))
        return tuple(choices)
    return None


def _coerce(key, value, where):
    """Checks ``value`` against the type of ``key``; returns it in that type."""
    annotation = FIELDS[key].type
    choices = _choices(annotation)
    ok = True
    if choices is not None:
        if isinstance(value, str) and value.lower() in ("none", "null") and None in choices:
            value = None
        ok = value in choices
    elif annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                ok = False
        ok = ok and isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        raise HParamsError(f"{where}: {key}={value!r} is not valid; expected {_describe(annotation)}")
    return value


def _apply(values, updates, where):
    if not isinstance(updates, dict):
        raise HParamsError(f"{where}: expected a mapping of hyper-parameter names to values, got {updates!r}")
    for key, value in updates.items():
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {', '.join(FIELDS)}"
            raise HParamsError(f"{where}: unknown key '{key}'{hint}")
        values[key] = _coerce(key, value, where)


def _check_ranges(hp, where):
    def fail(message):
        raise HParamsError(f"{where}: {message}")

    for key, field in FIELDS.items():
        if field.type is float and not math.isfinite(getattr(hp, key)):
            fail(f"{key}={getattr(hp, key)} must be a finite number")
    for key in ("num_blocks", "num_units", "num_heads", "d_ff", "maxlen", "min_count", "warmup_steps",
                "batch_size", "accumulate_steps", "num_epochs", "keep_checkpoints", "beam_size", "shard_pairs"):
        if getattr(hp, key) < 1:
            fail(f"{key}={getattr(hp, key)} must be at least 1")
    if hp.beam_size > MAX_BEAM_SIZE:
        fail(f"beam_size={hp.beam_size} must be at most {MAX_BEAM_SIZE} (the export's limit)")
    if not 0 <= hp.seed <= MAX_SEED:
        fail(f"seed={hp.seed} must be between 0 and {MAX_SEED}")
    for key, field in FIELDS.items():
        if field.type is int and key != "seed" and getattr(hp, key) > MAX_INT32:
            fail(f"{key}={getattr(hp, key)} must be at most {MAX_INT32} (it becomes a 32-bit integer in the graph)")
    if hp.max_decode_length > MAX_DECODE_LENGTH:
        fail(f"max_decode_length={hp.max_decode_length} must be at most {MAX_DECODE_LENGTH} tokens "
             f"(0: the source length + 50)")
    if hp.max_length_factor > MAX_LENGTH_FACTOR:
        fail(f"max_length_factor={hp.max_length_factor} must be at most {MAX_LENGTH_FACTOR:g} (0: none; a "
             f"sentence of n tokens gets at most n + 50 anyway, which any factor from 51 up allows)")
    if hp.beam_patience > MAX_BEAM_PATIENCE:
        fail(f"beam_patience={hp.beam_patience} must be at most {MAX_BEAM_PATIENCE:g} (0: the exact rule; 1: "
             f"CTranslate2's default)")
    if hp.vocab_size <= 4:
        fail(f"vocab_size={hp.vocab_size} must be larger than 4 (ids 0-3 are <PAD>, <UNK>, <S>, </S>)")
    for key in ("dropout_rate", "residual_dropout_rate", "label_smoothing", "adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(hp, key) < 1.0:
            fail(f"{key}={getattr(hp, key)} must be in [0, 1)")
    for key in ("clip_norm", "train_minutes", "length_penalty", "save_every_steps", "eval_every_epochs",
                "max_decode_length", "max_length_factor", "average_last", "beam_patience"):
        if getattr(hp, key) < 0:
            fail(f"{key}={getattr(hp, key)} must be 0 or more")
    for key in ("learning_rate", "adam_epsilon", "layer_norm_epsilon"):
        if not getattr(hp, key) > 0.0:
            fail(f"{key}={getattr(hp, key)} must be greater than 0")
    if hp.batch_tokens < 0 or 0 < hp.batch_tokens < hp.maxlen:
        fail(f"batch_tokens={hp.batch_tokens} must be 0 (batches of batch_size pairs) or at least "
             f"maxlen={hp.maxlen}, so that one pair of the longest kind fits a batch")
    if hp.shared_embeddings and hp.tokenizer != "sentencepiece":
        fail(f"shared_embeddings=true needs one vocabulary for both languages: tokenizer=sentencepiece "
             f"(the joint model), not tokenizer={hp.tokenizer}")
    if hp.average_last > hp.keep_checkpoints:
        fail(f"average_last={hp.average_last} averages more checkpoints than keep_checkpoints="
             f"{hp.keep_checkpoints} keeps")
    if hp.num_units % hp.num_heads:
        divisors = [h for h in range(1, min(hp.num_units, 64) + 1) if hp.num_units % h == 0]
        fail(
            f"num_units={hp.num_units} is not divisible by num_heads={hp.num_heads}; "
            f"num_heads that divide it: {divisors}"
        )


def _finish(values, where):
    missing = [key for key in FIELDS if key not in values]
    if missing:
        raise HParamsError(f"{where}: missing keys {missing}")
    hp = HParams(**values)
    _check_ranges(hp, where)
    return hp


def load_hparams(preset=None, config=None, overrides=(), presets_path=PRESETS_PATH):
    """Builds :class:`HParams` from the layers described in the module docstring.

    Args:
      preset: a name under ``presets`` in ``presets_path``; None for ``default_preset``.
      config: optional path of a flat YAML mapping.
      overrides: ``"key=value"`` strings; values are parsed as YAML.
    Raises:
      HParamsError: naming the file, key or value at fault.
    """
    doc = read_yaml(presets_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("defaults"), dict):
        raise HParamsError(f"{presets_path}: expected a 'defaults' mapping and a 'presets' mapping")
    values = {}
    _apply(values, doc["defaults"], f"{presets_path}: defaults")
    presets = doc.get("presets") or {}
    preset = preset or doc.get("default_preset")
    if preset not in presets:
        raise HParamsError(f"unknown preset {preset!r}; choose one of: {', '.join(presets)}")
    _apply(values, presets[preset] or {}, f"{presets_path}: presets.{preset}")
    where = f"preset '{preset}'"
    if config:
        mapping = read_yaml(config)
        _apply(values, {} if mapping is None else mapping, config)  # an empty file changes nothing
        where += f" + {config}"
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise HParamsError(f"--set {item}: expected key=value, e.g. --set num_blocks=2")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        _apply(values, {key.strip(): value}, f"--set {item}")
        where += f" + --set {item}"
    return _finish(values, where)
