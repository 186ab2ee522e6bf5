"""Scoring during and after training: dev evaluations, samples, the best checkpoint, the test split.

:class:`Evaluator` translates the dev pairs (or, without a dev split, some
training pairs) with the model as it is, scores them (BLEU and chrF with
sacrebleu's signatures), writes sample translations to
``MODEL_DIR/samples-stepN.txt`` and TensorBoard, redraws ``MODEL_DIR/curves.png``
and keeps the best checkpoint by dev BLEU in ``MODEL_DIR/best/``. At the end of
a run (:meth:`Evaluator.finish`) it loads the best weights (or the average of
the last checkpoints, ``average_last``, when that is better) and scores the test
split with them.
"""

import dataclasses
import os
import time

from tf_transformer.data import data_load
from tf_transformer.infer.translate import attention_sample, translate
from tf_transformer.model_dir import checkpoint_files
from tf_transformer.train import average
from tf_transformer.train.scores import Scores, evaluate, format_samples, write_samples

# Without a dev split, this many training pairs are translated and scored instead.
EVAL_PAIRS_FROM_TRAIN = 500


def eval_pairs(splits, train_pairs, tokenizers, maxlen, log):
    """The pairs every evaluation scores: the dev split, else the first training pairs
    that training kept (at most ``maxlen`` tokens a side)."""
    if "dev" in splits:
        return splits["dev"].read().pairs
    pairs = train_pairs[:4 * EVAL_PAIRS_FROM_TRAIN]
    lengths = [data_load.tokenize_with_eos(tokenizer, [pair[side] for pair in pairs]).row_lengths().numpy()
               for side, tokenizer in enumerate(tokenizers)]
    pairs = [pair for pair, n, m in zip(pairs, *lengths) if max(n, m) <= maxlen][:EVAL_PAIRS_FROM_TRAIN]
    log(f"no dev split: evaluations score {len(pairs)} training pairs instead (BLEU on seen data)")
    return pairs


@dataclasses.dataclass
class Evaluation:
    """One dev evaluation: its step, :class:`~tf_transformer.train.scores.Scores` and samples file."""

    step: int
    scores: Scores
    samples_file: str


@dataclasses.dataclass
class Final:
    """What :meth:`Evaluator.finish` found (None where not computed): the last dev and the test
    :class:`~tf_transformer.train.scores.Scores`, the last samples file, and the checkpoint whose
    weights the model ends with (the best, or the average of the last checkpoints) and that
    checkpoint's dev BLEU."""

    dev: Scores = None
    test: Scores = None
    samples_file: str = None
    best_checkpoint: str = None
    best_dev_bleu: float = None


class Evaluator:
    """Dev and test scoring of one training run (its chief); see the module docstring.

    Args:
      hp: :class:`~tf_transformer.hparams.HParams` (decoding: ``beam_size``, ``length_penalty``,
        ``max_decode_length``, ``max_length_factor``; ``average_last``).
      model: the model being trained.
      tokenizers: (source, target).
      model_dir: the model directory.
      dev_pairs: the (source, reference) pairs every evaluation scores (:func:`eval_pairs`).
      test_pairs: the test split's pairs, or None.
      summaries: :class:`~tf_transformer.train.summaries.Summaries`.
      best: :class:`~tf_transformer.train.scores.BestCheckpoint`.
      log: ``callable(str)``.
    Attributes:
      last: the last :class:`Evaluation`, None before the first.
    """

    def __init__(self, hp, model, tokenizers, model_dir, dev_pairs, test_pairs, summaries, best, log):
        self.hp, self.model, self.tokenizers, self.model_dir = hp, model, tokenizers, model_dir
        self.dev_pairs, self.test_pairs, self.summaries, self.best, self.log = \
            dev_pairs, test_pairs, summaries, best, log
        self.last = None

    def translate(self, sentences):
        """The model's translations of ``sentences`` with the run's decoding settings."""
        hp = self.hp
        return translate(sentences, *self.tokenizers, self.model, batch_size=64,
                         max_length=hp.max_decode_length or None, beam_size=hp.beam_size,
                         length_penalty=hp.length_penalty, max_length_factor=hp.max_length_factor,
                         patience=hp.beam_patience)

    def score(self, pairs):
        """:class:`~tf_transformer.train.scores.Scores` of the model's translations of ``pairs``' sources."""
        return evaluate([s for s, _ in pairs], [t for _, t in pairs], self.translate)

    def evaluate(self, step):
        """Scores the dev pairs at ``step``: log, summaries, samples, curves, best checkpoint.

        Returns:
          the :class:`Evaluation`, also kept as :attr:`last`.
        """
        sources, references = [s for s, _ in self.dev_pairs], [t for _, t in self.dev_pairs]
        started = time.monotonic()
        scores = self.score(self.dev_pairs)
        self.log(f"dev at step {step} ({len(sources)} sentences, {time.monotonic() - started:.1f}s): "
                 f"{scores.format()}")
        samples_file = os.path.join(self.model_dir, f"samples-step{step}.txt")
        write_samples(samples_file, sources, references, scores.hypotheses,
                                 header=f"dev, step {step}: {scores.format()}")
        self.summaries.scalars(step, **{"dev/bleu": scores.bleu, "dev/chrf": scores.chrf})
        self.summaries.text(step, "dev/samples", format_samples(sources, references, scores.hypotheses))
        self.summaries.attention_image(step, "dev/attention",
                                       *attention_sample(self.model, self.tokenizers, sources[0], scores.hypotheses[0]))
        self.summaries.flush()
        self.summaries.write_curves()  # MODEL_DIR/curves.png: loss, learning rate, dev BLEU
        if self.best.update(scores, step):
            self.log(f"best dev BLEU so far: {scores.bleu:.2f}, kept as {self.best.path}")
        self.last = Evaluation(step, scores, samples_file)
        return self.last

    def finish(self, step, samples):
        """The end of a complete run: the dev evaluation at ``step`` (unless :attr:`last` is of it),
        ``samples`` of its translations logged, the best checkpoint's weights (or the better average's)
        into the model, the test split scored with them.

        Returns:
          :class:`Final`.
        """
        last = self.last if self.last is not None and self.last.step == step else self.evaluate(step)
        final = Final(dev=last.scores, samples_file=last.samples_file)
        for source, translation in list(zip((s for s, _ in self.dev_pairs), last.scores.hypotheses))[:samples]:
            self.log(f"  {source}  ->  {translation}")
        trial = self.average() if self.hp.average_last else None
        averaged = trial is not None and trial.checkpoint is not None
        if averaged:  # the model holds the average's weights
            final.best_checkpoint, final.best_dev_bleu = trial.checkpoint, trial.scores.bleu
        elif self.best.path:
            checkpoint_files.restore_model(self.model, self.best.path)
            final.best_checkpoint, final.best_dev_bleu = self.best.path, self.best.bleu
            self.log(f"best checkpoint: {self.best.path} (dev BLEU {self.best.bleu:.2f})")
        if self.test_pairs is not None:
            final.test = self.score_test(step, "average of the last checkpoints" if averaged else "best checkpoint")
        return final

    def average(self):
        """``average_last``: the average of the last checkpoints into the model and MODEL_DIR/average/
        when it beats the best dev BLEU; returns the :class:`~tf_transformer.train.average.AverageTrial`
        (its ``checkpoint`` None when the average was dropped or not made)."""
        trial = average.average_if_better(self.model_dir, self.hp.average_last, self.model, self.hp, self.tokenizers,
                                          lambda: self.score(self.dev_pairs), self.best.bleu, log=self.log)
        if trial.scores is not None:
            self.log(f"average of the last {self.hp.average_last} checkpoints: dev {trial.scores.format()}; "
                     + (f"kept as {trial.checkpoint}" if trial.checkpoint
                        else f"not better than dev BLEU {self.best.bleu:.2f}, dropped"))
        return trial

    def score_test(self, step, weights):
        """Scores the test split with the model's weights now, ``weights`` saying which they are."""
        scores = self.score(self.test_pairs)
        self.log(f"test ({len(self.test_pairs)} sentences, {weights}): {scores.format()}")
        self.summaries.scalars(step, **{"test/bleu": scores.bleu, "test/chrf": scores.chrf})
        return scores
