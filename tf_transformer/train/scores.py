"""Scoring translations: corpus BLEU and chrF, the best checkpoint by dev BLEU, sample files.

* :func:`evaluate` translates a split with any ``translate_fn`` and scores it
  with ``sacrebleu``'s metric objects, whose signatures say exactly how the
  score was computed (tokenizer, casing, smoothing, version), so that a
  number printed here can be compared with a published one.
* :class:`BestCheckpoint` keeps, in ``MODEL_DIR/best/``, the checkpoint with
  the highest dev BLEU seen so far, with a small record of its scores that a
  restarted run reads back.
* :func:`format_samples` / :func:`write_samples` show a few sources,
  references and hypotheses side by side (for a file or a text summary).
"""

import dataclasses
import os

import tensorflow as tf
import yaml
from sacrebleu.metrics import BLEU, CHRF

from tf_transformer.errors import UserError
from tf_transformer.files import write_atomic
from tf_transformer.model_dir.layout import BEST_DIR
from tf_transformer.train.checkpoints import save_checkpoint

BEST_RECORD = "best.yaml"


@dataclasses.dataclass(frozen=True)
class Scores:
    """Corpus scores of one split, in sacrebleu's 0-100 scale.

    Attributes:
      bleu, chrf: corpus BLEU and chrF.
      bleu_signature, chrf_signature: sacrebleu's signatures, e.g.
        ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``.
      hypotheses: the translations that were scored, in input order.
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    hypotheses: list = dataclasses.field(repr=False)

    def format(self):
        """One line: ``BLEU 23.4 chrF 51.2 (BLEU signature: ...; chrF signature: ...)``."""
        return (f"BLEU {self.bleu:.1f} chrF {self.chrf:.1f} "
                f"(BLEU signature: {self.bleu_signature}; chrF signature: {self.chrf_signature})")


def score(hypotheses, references):
    """Corpus BLEU and chrF of ``hypotheses`` against one reference each.

    Args:
      hypotheses, references: lists of str of the same length, at least one.
    Returns:
      :class:`Scores`.
    Raises:
      UserError: no sentences, or the two lists differ in length.
    """
    if not references:
        raise UserError("no sentences to score: the evaluation split is empty")
    if len(hypotheses) != len(references):
        raise UserError(f"{len(hypotheses)} hypotheses for {len(references)} references; "
                        f"each reference needs exactly one hypothesis")
    bleu, chrf = BLEU(), CHRF()
    return Scores(
        bleu=bleu.corpus_score(hypotheses, [references]).score,
        chrf=chrf.corpus_score(hypotheses, [references]).score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        hypotheses=list(hypotheses),
    )


def evaluate(sources, references, translate_fn):
    """Translates ``sources`` and scores the translations against ``references``.

    Args:
      sources, references: line-aligned lists of str (one reference per source).
      translate_fn: ``list[str] -> list[str]``, one translation per source, in order.
    Returns:
      :class:`Scores`.
    Raises:
      UserError: empty input, or ``sources`` and ``references`` differ in length.
      ValueError: ``translate_fn`` returned another number of translations (a bug).
    """
    if not sources:
        raise UserError("no sentences to evaluate: the evaluation split is empty")
    if len(sources) != len(references):
        raise UserError(f"{len(sources)} sources but {len(references)} references; "
                        f"an evaluation split needs one reference per source")
    hypotheses = list(translate_fn(list(sources)))
    if len(hypotheses) != len(sources):
        raise ValueError(f"translate_fn returned {len(hypotheses)} translations for {len(sources)} sources")
    return score(hypotheses, list(references))


class BestCheckpoint:
    """The checkpoint with the best dev BLEU so far, in ``MODEL_DIR/best/``.

    A ``tf.train.CheckpointManager`` with ``max_to_keep=1`` over the training
    run's ``tf.train.Checkpoint`` (so the best checkpoint restores exactly like
    the latest one), and ``best/best.yaml``: ``bleu``, ``chrf``, ``step``, the
    signatures and the checkpoint's file name, written atomically after the
    checkpoint. A new instance on the same directory reads the record back,
    so a restarted run only replaces a checkpoint that it beats.

    If a run was killed between saving a checkpoint and writing its record,
    the record names an older checkpoint than the one on disk; the record's
    BLEU is then kept as the bar to beat (the checkpoint on disk scored higher)
    and :attr:`path` is the checkpoint on disk.

    Example::

      best = BestCheckpoint(model_dir, tf.train.Checkpoint(model=model, optimizer=optimizer))
      if best.update(scores, step):
          log(f"new best: {best.path}")
    """

    def __init__(self, model_dir, checkpoint):
        self.directory = os.path.join(model_dir, BEST_DIR)
        self.record_path = os.path.join(self.directory, BEST_RECORD)
        self.manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=1)
        # A record without its checkpoint (deleted by hand) sets no bar to beat.
        self.record = self._read_record() if self.manager.latest_checkpoint else None

    def _read_record(self):
        if not os.path.exists(self.record_path):
            return None
        with open(self.record_path, encoding="utf-8") as f:
            try:
                record = yaml.safe_load(f)
            except yaml.YAMLError:
                record = None
        if not isinstance(record, dict) or not isinstance(record.get("bleu"), (int, float)):
            raise UserError(f"{self.record_path}: not a best-checkpoint record (expected a mapping with "
                            f"bleu, chrf, step); delete it to start the best-checkpoint tracking afresh")
        return record

    @property
    def bleu(self):
        """The best dev BLEU so far, or None before the first :meth:`update`."""
        return None if self.record is None else float(self.record["bleu"])

    @property
    def path(self):
        """The best checkpoint's path prefix (for ``checkpoint.restore``), or None."""
        return self.manager.latest_checkpoint

    def update(self, scores, step):
        """Saves the checkpoint when ``scores.bleu`` is strictly better than the best so far.

        Args:
          scores: :class:`Scores` of the dev split.
          step: the training step, used as the checkpoint number.
        Returns:
          True when a checkpoint was saved.
        """
        if self.bleu is not None and not scores.bleu > self.bleu:
            return False
        path = save_checkpoint(self.manager, int(step))
        self.record = {"bleu": float(scores.bleu), "chrf": float(scores.chrf), "step": int(step),
                       "checkpoint": os.path.basename(path), "bleu_signature": scores.bleu_signature,
                       "chrf_signature": scores.chrf_signature}
        write_atomic(self.record_path, yaml.safe_dump(self.record, sort_keys=False))
        return True


def format_samples(sources, references, hypotheses, n=10):
    """The first ``n`` triples as readable lines: a numbered block of ``source``,
    ``reference`` and ``hypothesis`` per sentence, blocks separated by a blank line.

    Returns:
      list of str (no line ends).
    """
    if not len(sources) == len(references) == len(hypotheses):
        raise ValueError(f"{len(sources)} sources, {len(references)} references and "
                         f"{len(hypotheses)} hypotheses; they must be line-aligned")
    lines = []
    for i, (source, reference, hypothesis) in enumerate(list(zip(sources, references, hypotheses))[:n]):
        if lines:
            lines.append("")
        lines += [f"[{i + 1}]", f"source:     {source}", f"reference:  {reference}", f"hypothesis: {hypothesis}"]
    return lines


def write_samples(path, sources, references, hypotheses, n=10, header=None):
    """Writes :func:`format_samples` to ``path`` atomically, after an optional ``header``
    line (e.g. the step and :meth:`Scores.format`)."""
    lines = ([header, ""] if header else []) + format_samples(sources, references, hypotheses, n)
    write_atomic(path, "\n".join(lines) + "\n")
