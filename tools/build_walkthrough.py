#!/usr/bin/env python3
"""Writes docs/walkthrough.ipynb, the blog as a notebook that runs, and executes it in place.

    PYTHONPATH=. python tools/build_walkthrough.py          # write and execute (outputs stored)
    PYTHONPATH=. python tools/build_walkthrough.py --no-run # write the cells only

The cells are below, in the blog's order (shared/seeds/000-003): embedding and positions,
``normalize``, the masks, multi-head attention, ``feedforward``, ``label_smoothing``, one
encoder and one decoder block, the toy corpus trained to convergence with its decode
trace and attention, and the blog-exact switch beside the default. The outputs are stored
in the file (nbclient, kernel ``python3``, cwd = the repository root) so that a docs site
shows them; tests/test_walkthrough.py executes it again and checks them.
"""

import argparse
import os
import sys
import time

import nbformat

from tf_transformer.quiet import QUIET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "docs", "walkthrough.ipynb")

CELLS = [
    ("md", r"""# The blog, as a notebook that runs

This notebook walks through Kyubyong's TF1 Transformer the way the blog posts do
(`multihead_attention`, `key_masks`, `query_masks`, `causality`, `num_units`, `num_heads`,
`normalize`, `embedding`, `feedforward`, `label_smoothing`), with the layers of this
repository (`tf_transformer.nn.modules`, `tf_transformer.nn.model`), tiny sizes, and
every output computed. At the end it trains the toy corpus of the blog (three German
sentences) to convergence and sets the blog-exact model (`--preset blog`) beside the
default one.

| blog (TF1 `modules.py`) | here |
|---|---|
| `normalize` | `modules.LayerNorm` |
| `embedding` | `modules.Embedding` (`zero_pad`, `scale`) |
| `positional_encoding` | `modules.PositionalEncoding`, `modules.sinusoid_table` |
| `multihead_attention` | `modules.MultiheadAttention` (`num_units`, `num_heads`, `causality`, `key_masks`, `query_masks`) |
| `feedforward` | `modules.FeedForward` |
| `label_smoothing` | `modules.label_smoothing` |
| encoder / decoder loop | `model.EncoderBlock`, `model.DecoderBlock`, `model.Transformer` |

Shapes use the blog's letters: `N` batch, `T_q`/`T_k` query/key length, `C` = `num_units`,
`h` = `num_heads`. Rebuild this file with `python tools/build_walkthrough.py`."""),
    ("code", r"""from tf_transformer.quiet import quiet_tensorflow
quiet_tensorflow()  # TensorFlow's start-up notices off, as the commands keep them (before importing it)
import time
import numpy as np
import tensorflow as tf
import keras
from IPython.display import Image, display

from tf_transformer import figures
from tf_transformer.nn import modules
from tf_transformer.nn.model import TransformerConfig, EncoderBlock, DecoderBlock, Transformer

STARTED = time.monotonic()
keras.utils.set_random_seed(0)
np.set_printoptions(precision=3, suppress=True, linewidth=110)

def show(figure, dpi=80):
    # figures.py draws on a bare Agg Figure (no pyplot): show it as a small PNG
    display(Image(figures.figure_to_png(figure, dpi=dpi)))

print("tensorflow", tf.__version__, "keras", keras.__version__)"""),

    ("md", r"""## 1. `embedding` and positional encoding

The blog's `embedding(inputs, vocab_size, num_units, zero_pad=True, scale=True)`: a lookup
table whose row 0 (`<PAD>`) is forced to zeros, the result multiplied by `sqrt(num_units)`.
Below, a padded batch of two sentences (id 0 is `<PAD>`)."""),
    ("code", r"""ids = tf.constant([[5, 6, 7, 3, 0, 0],
                   [8, 9, 3, 0, 0, 0]])            # (N, T) = (2, 6); 3 is </S>, 0 is <PAD>
embedding = modules.Embedding(vocab_size=10, num_units=8, zero_pad=True, scale=True)
embedded = embedding(ids)                           # (N, T, C)
print("embedded:", embedded.shape)
print("norm of each position's vector (pads are exactly 0):")
print(tf.norm(embedded, axis=-1).numpy())
print("scale: table row 5 * sqrt(8) == embedded[0, 0]:",
      bool(np.allclose(embedding.lookup_table[5].numpy() * 8 ** 0.5, embedded[0, 0].numpy())))"""),
    ("md", r"""The paper's sinusoid: `PE(pos, 2i) = sin(pos / 10000^(2i/C))`, `PE(pos, 2i+1) = cos(...)`,
added to the embedding. `modules.sinusoid_table` builds it for any length (the blog's
published setting is a *learned* table of `maxlen` rows instead, see section 8).
The picture is `figures.plot_positional_encoding`, the blog's heat map."""),
    ("code", r"""table = modules.sinusoid_table(50, 64).numpy()      # (T, C) = (50, 64)
print("table:", table.shape, " PE(pos=1, 0:4) =", table[1, :4])
positions = modules.PositionalEncoding(num_units=8)(ids)   # (1, T, C), broadcast over the batch
print("PositionalEncoding(ids):", positions.shape)
show(figures.plot_positional_encoding(table))"""),

    ("md", r"""## 2. `normalize`

Layer norm over the last axis with the population variance and the blog's `epsilon=1e-8`
(Keras' own `LayerNormalization` defaults to 1e-3)."""),
    ("code", r"""x = tf.constant([[1.0, 2.0, 3.0, 6.0]])
normalized = modules.LayerNorm()(x)
print(normalized.numpy(), " mean", float(tf.reduce_mean(normalized)), " var", float(tf.math.reduce_variance(normalized)))"""),

    ("md", r"""## 3. The masks: `key_masks`, `query_masks`, `causality`

In the blog, masks are 1 for a real token and 0 for padding, and a masked score is replaced
by a very small number (`-2**32 + 1`) before the softmax:

* **key masks** (step 4): no query may attend to a padded key: a masked *column*;
* **query masks** (step 7): the attention output of a padded query is zeroed: a masked *row*;
* **causality** (step 5): in decoder self-attention, position `t` may attend to keys `<= t`
  only: the lower triangle (`tf.linalg.band_part(ones, -1, 0)`).

Our model computes the masks once, from the token embedding *before* positions are added
(`modules.masks_from_embedding`): the `<PAD>` row is exactly zero, so the sign of the
row's absolute sum is 0 for padding and 1 otherwise."""),
    ("code", r"""masks = modules.masks_from_embedding(embedded)      # (N, T)
print("key/query masks (1 = real token):")
print(masks.numpy())
T = ids.shape[1]
causal = tf.linalg.band_part(tf.ones([T, T]), -1, 0)
print("causal mask (T_q, T_k), 1 = may attend:")
print(causal.numpy().astype(int))"""),
    ("code", r"""attention = modules.MultiheadAttention(num_units=8, num_heads=2, causality=True)
x = embedded + positions
outputs = attention(x, x, key_masks=masks, query_masks=masks)             # builds the layer: (N, T, C)
w = attention.attention_weights(x, x, key_masks=masks, query_masks=masks)   # (N, h, T_q, T_k)
print("weights of sentence 2, head 1 (3 real tokens, then 3 pads):")
print(w[1, 0].numpy())
print("padded keys get weight 0:", bool(tf.reduce_all(w[1, :, :, 3:] == 0)),
      "| padded queries' rows are 0:", bool(tf.reduce_all(w[1, :, 3:, :] == 0)),
      "| nothing above the diagonal:", bool(tf.reduce_all(tf.linalg.band_part(w, 0, -1) - tf.linalg.band_part(w, 0, 0) == 0)))"""),
    ("md", r"""### Beside Keras' `MultiHeadAttention`

`keras.layers.MultiHeadAttention` takes one boolean `attention_mask` of shape `(N, T_q, T_k)`
where **True = attend** (or `use_causal_mask=True`). The blog's masks have the same sense
(1 = real / may attend), so the Keras mask is `key_masks[:, None, :] & causal`.

The old TensorFlow Transformer tutorial used the **opposite** sense: its
`create_look_ahead_mask` is `1 - band_part(ones, -1, 0)`, **1 = hide**, added as
`mask * -1e9` in its own attention layer. Readers who swapped in the Keras layer and passed
that mask unchanged gave each position the *future* and hid the past: a decoder that sees
the words it should predict, trains to near-zero loss and translates nothing
([tensorflow/text#894](https://github.com/tensorflow/text/pull/894) added a warning to the
tutorial; [tensorflow/text#938](https://github.com/tensorflow/text/issues/938): the padding
mask must be inverted too)."""),
    ("code", r"""blog_style = causal                                   # 1 = attend (the blog, and Keras)
tutorial_look_ahead = 1 - causal                      # 1 = hide (the old TF tutorial)
keras_mask = tf.logical_and(tf.cast(masks[:, None, :], tf.bool), tf.cast(blog_style, tf.bool)[None])
print("Keras attention_mask for sentence 2 (True = attend):")
print(keras_mask[1].numpy().astype(int))
print("the tutorial's look-ahead mask (1 = hide), which Keras would read as 'attend':")
print(tutorial_look_ahead.numpy().astype(int))"""),
    ("md", r"""**The causal check.** Perturb the tokens *after* position `t` and look at the output at
positions `<= t`: with a correct causal mask nothing there may change. First our
`MultiheadAttention(causality=True)`, then a whole `Transformer`'s logits (every decoder
block), then Keras' layer given the tutorial's inverted mask."""),
    ("code", r"""t = 2
x = tf.random.normal([1, 6, 8])
x_future = tf.concat([x[:, :t + 1], tf.random.normal([1, 5 - t, 8])], axis=1)   # positions > t changed
layer = modules.MultiheadAttention(num_units=8, num_heads=2, causality=True)
ones = tf.ones([1, 6])
before = layer(x, x, key_masks=ones, query_masks=ones)
after = layer(x_future, x_future, key_masks=ones, query_masks=ones)
layer_ok = bool(np.allclose(before[:, :t + 1], after[:, :t + 1], atol=1e-6))
print(f"MultiheadAttention: outputs at positions <= {t} unchanged:", layer_ok,
      "| positions > t changed:", not np.allclose(before[:, t + 1:], after[:, t + 1:]))

tiny = TransformerConfig(num_blocks=2, num_units=16, num_heads=2, d_ff=32, dropout_rate=0.0, residual_dropout_rate=0.0)
model = Transformer(12, 12, tiny)
source = tf.constant([[5, 6, 7, 3]])
decoder_inputs = tf.constant([[2, 4, 5, 6, 7, 8]])
changed = tf.concat([decoder_inputs[:, :t + 1], tf.constant([[11, 10, 9]])], axis=1)
logits, logits_changed = model((source, decoder_inputs)), model((source, changed))
delta = np.abs(logits.numpy() - logits_changed.numpy()).max(axis=-1)[0]
model_ok = bool(delta[:t + 1].max() < 1e-5)
print("Transformer logits, max |change| per decoder position:", delta)
print(f"causal check (no dependence of position <= {t} on later tokens):", layer_ok and model_ok)

keras_mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
def keras_out(inputs, mask):
    return keras_mha(inputs, inputs, attention_mask=tf.cast(mask, tf.bool)[None]).numpy()
right = np.abs(keras_out(x, causal) - keras_out(x_future, causal))[0, :t + 1].max()
wrong = np.abs(keras_out(x, tutorial_look_ahead) - keras_out(x_future, tutorial_look_ahead))[0, :t + 1].max()
print(f"Keras MHA, True = attend mask: max |change| at positions <= {t}: {right:.2e}")
print(f"Keras MHA, the tutorial's inverted mask: max |change| at positions <= {t}: {wrong:.2e}  <- sees the future")"""),

    ("md", r"""## 4. `multihead_attention`: split heads, concat heads

Step 1 projects queries, keys and values (`num_units` wide); step 2 splits them into
`num_heads` heads stacked on the batch axis, `concat(split(x, h, axis=2), axis=0)`:
(N, T, C) -> (h\*N, T, C/h). Step 3 is the scaled dot product `Q_ K_^T / sqrt(C/h)`,
(h\*N, T_q, T_k); steps 4-7 are the masks and softmax above; step 9 concatenates the heads
back, `concat(split(outputs, h, axis=0), axis=2)`: (N, T_q, C). Our `split_heads` is one
reshape-transpose-reshape with the same layout."""),
    ("code", r"""N, T_, C, h = 2, 5, 8, 4
x = tf.reshape(tf.range(N * T_ * C, dtype=tf.float32), [N, T_, C])
Q_ = modules.split_heads(x, h)
blog_Q_ = tf.concat(tf.split(x, h, axis=2), axis=0)
print("x:", x.shape, "-> split_heads:", Q_.shape, "| equals the blog's concat(split(x, h, axis=2), axis=0):",
      bool(tf.reduce_all(Q_ == blog_Q_)))
scores = tf.matmul(Q_, Q_, transpose_b=True) / (C // h) ** 0.5
print("scores Q_ K_^T / sqrt(C/h):", scores.shape)
back = modules.combine_heads(Q_, h)
print("combine_heads:", back.shape, "| inverse of split_heads:", bool(tf.reduce_all(back == x)))

mha = modules.MultiheadAttention(num_units=C, num_heads=h, output_projection=True)
out = mha(x, x, key_masks=tf.ones([N, T_]), query_masks=tf.ones([N, T_]))
print("MultiheadAttention(num_units=8, num_heads=4):", x.shape, "->", out.shape)
print("weights:", [(v.name, tuple(v.shape)) for v in mha.weights])"""),

    ("md", r"""## 5. `feedforward` and `label_smoothing`

`feedforward(inputs, num_units=[d_ff, C])`: position-wise `C -> d_ff (ReLU) -> C`, residual,
`normalize`. `label_smoothing(inputs, epsilon=0.1)`: `(1 - epsilon) * onehot + epsilon / V`."""),
    ("code", r"""ff = modules.FeedForward(d_ff=32)
print("FeedForward(d_ff=32):", x.shape, "->", ff(x).shape)
onehot = tf.one_hot([2, 0], depth=5)
print("label_smoothing of one-hot rows (V = 5):")
print(modules.label_smoothing(onehot).numpy())"""),

    ("md", r"""## 6. One encoder block and one decoder block

Encoder block: self-attention (keys = queries = the block's input) then feed-forward.
Decoder block: causal self-attention, encoder-decoder attention (the blog's
`vanilla_attention`: queries from the decoder, keys and values from the encoder output),
then feed-forward. The masks are passed in (our default, `mask_source: embedding`)."""),
    ("code", r"""config = TransformerConfig(num_blocks=1, num_units=8, num_heads=2, d_ff=16, dropout_rate=0.0,
                           residual_dropout_rate=0.0)
source_ids = ids                                   # (2, 6)
target_ids = tf.constant([[2, 4, 5, 0], [2, 6, 0, 0]])   # decoder inputs: <S> + target shifted right
enc_in = embedded + positions
source_masks = masks
dec_embedded = modules.Embedding(10, 8)(target_ids)
target_masks = modules.masks_from_embedding(dec_embedded)
dec_in = dec_embedded + modules.PositionalEncoding(8)(target_ids)

encoder_block = EncoderBlock(config)
memory = encoder_block(enc_in, masks=source_masks)
print("encoder block:", enc_in.shape, "->", memory.shape)
decoder_block = DecoderBlock(config)
dec_out = decoder_block(dec_in, memory, source_masks=source_masks, target_masks=target_masks)
print("decoder block:", dec_in.shape, "+ memory", memory.shape, "->", dec_out.shape)
print("encoder block sub-layers:", [encoder_block.self_attention.name, encoder_block.feedforward.name])
print("decoder block sub-layers:", [decoder_block.self_attention.name, decoder_block.vanilla_attention.name,
                                    decoder_block.feedforward.name],
      "| causality:", decoder_block.self_attention.causality, decoder_block.vanilla_attention.causality)
_, cross = decoder_block.call_with_weights(dec_in, memory, source_masks, target_masks)
print("encoder-decoder attention weights (N, h, T_y, T_x):", cross.shape,
      "| pad columns of sentence 2 are 0:", bool(tf.reduce_all(cross[1, :, :, 3:] == 0)))"""),

    ("md", r"""## 7. The toy corpus, trained to convergence

Seed 003 trains on three sentence pairs (`ich mochte ein bier` -> `i want a beer`, ...). The
repository embeds them as the `toy` corpus and has a `toy` preset (2 blocks of 32 units,
word vocabularies, constant rate 3e-3, 150 one-batch epochs): `python train.py --preset toy
--data toy` reaches dev BLEU 100 (its dev split is the training pairs). Here the pieces the
command uses, called directly and without a model directory: the preset's hyper-parameters
(60 epochs instead of 150: the accuracy is 1.000 after 10), the corpus, word tokenizers,
the model and optimizer built as `train.py` builds them, its compiled training step and epoch
batches; then greedy decoding with its step-by-step trace, and BLEU with sacrebleu."""),
    ("code", r"""from tf_transformer import hparams
from tf_transformer.data import corpus, data_load
from tf_transformer.data.tokenizer import train_tokenizers
from tf_transformer.train import step as training, scores
from tf_transformer.infer import translate
from tf_transformer.model_dir import checkpoint_files

hp = hparams.load_hparams("toy", overrides=["precision=float32", "num_epochs=60"])
pairs = corpus.corpus_splits("toy")["train"].read().pairs
for source, target in pairs:
    print(f"  {source}  ->  {target}")
tokenizers = train_tokenizers(hp, pairs)
examples = data_load.encode_pairs(pairs, *tokenizers, hp.maxlen)
keras.utils.set_random_seed(hp.seed)
toy = checkpoint_files.build_model(hp, *tokenizers)         # a Transformer, its weights created
optimizer = training.make_optimizer(hp)
optimizer.build(toy.trainable_variables)                     # so the step is traced once
train_step = training.make_train_step(toy, optimizer, hp)
print(f"vocabularies: {tokenizers[0].vocab_size} source, {tokenizers[1].vocab_size} target words;",
      f"{hp.num_blocks} blocks x {hp.num_units} units; {hp.num_epochs} epochs of one batch")

started = time.monotonic()
for epoch in range(hp.num_epochs):
    for x, y in training.epoch_batches(examples, hp, epoch):
        loss, accuracy = train_step(x, y)
    if (epoch + 1) % 10 == 0:
        print(f"epoch {epoch + 1:3d}: loss {float(loss):.4f}, accuracy {float(accuracy):.3f}")
print(f"{sum(int(np.prod(v.shape)) for v in toy.trainable_variables)} weights trained in {time.monotonic() - started:.1f}s")
print(f"final training accuracy: {float(accuracy):.3f}")"""),
    ("code", r"""sources = [s for s, _ in pairs]
references = [t for _, t in pairs]
trace = []
hypotheses = translate.translate(sources, *tokenizers, toy, beam_size=1, trace=trace.append)
print("greedy decode trace (one line per step, every sentence of the batch):")
print("\n".join(trace))
result = scores.score(hypotheses, references)
for s, hyp in zip(sources, hypotheses):
    print(f"  {s}  ->  {hyp}")
print(f"toy dev BLEU: {result.bleu:.1f}")"""),
    ("md", r"""The encoder-decoder attention of every head of both decoder blocks while the model writes
its translation (`translate.attention_figure`, drawn by `figures.plot_attention`): rows are
the output tokens, columns the source tokens."""),
    ("code", r"""sentence = sources[2]
output_ids = data_load.tokenize_with_eos(tokenizers[1], [hypotheses[2]])[0].numpy()
show(translate.attention_figure(sentence, *tokenizers, toy, output_ids, path=None))"""),

    ("md", r"""## 8. The blog-exact switch beside the default

`--preset blog` (Kyubyong/transformer 0537d9e, 2017) selects the original's choices; the
default model fixes them. The options that differ:"""),
    ("code", r"""default_hp = hparams.load_hparams()            # default_preset: small
blog_hp = hparams.load_hparams("blog")
model_fields = TransformerConfig.names()
print(f"{'option':22s} {'default':>12s} {'blog':>12s}")
for name in model_fields:
    a, b = getattr(default_hp, name), getattr(blog_hp, name)
    if a != b:
        print(f"{name:22s} {str(a):>12s} {str(b):>12s}")"""),
    ("md", r"""Now two small models, the same sizes and the same input, one with the default's model
options and one with the blog's (`num_blocks`, `num_units`, `num_heads`, `d_ff` and `maxlen`
made tiny for both; dropout off). Four defects of the original, with numbers:

1. **Masks from the sign of the input.** The blog recomputes `key_masks = sign(abs(reduce_sum(x, -1)))`
   in every layer, from that layer's input, which already holds the positions: no row sums to 0
   any more, so nothing is masked.
2. **So padding changes the real positions' outputs**: the same sentence padded to 4 and to 9
   tokens gives different encoder outputs at its real tokens.
3. **A real row that sums to zero is masked** by that rule.
4. **Learned positions stop at `maxlen`** (10 in the blog): the original indexed out of range;
   here positions past `maxlen` reuse the last row, while the sinusoid has a row for any length."""),
    ("code", r"""tiny_sizes = dict(num_blocks=2, num_units=16, num_heads=2, d_ff=32, dropout_rate=0.0, residual_dropout_rate=0.0,
                  maxlen=10)
import dataclasses
configs = {name: dataclasses.replace(TransformerConfig.of(h), **tiny_sizes)
           for name, h in [("default", default_hp), ("blog", blog_hp)]}
models = {}
for name, c in configs.items():
    keras.utils.set_random_seed(1)
    models[name] = Transformer(12, 12, c)

sentence = tf.constant([[5, 6, 7, 3, 0, 0, 0, 0, 0]])        # 4 real tokens, padded to 9
short = sentence[:, :4]                                      # the same sentence, no padding
for name, m in models.items():
    embedded_ = m.enc_embedding(sentence)
    with_positions = embedded_ + m.enc_positions(sentence)
    blog_rule = modules.key_masks_from_inputs(with_positions)   # the blog's rule, in the first layer
    ours = modules.masks_from_embedding(embedded_)
    padded_memory = m.encode(sentence, training=False).memory[:, :4]
    short_memory = m.encode(short, training=False).memory
    diff = float(tf.reduce_max(tf.abs(padded_memory - short_memory)))
    used = "the blog's sign(abs(sum(x)))" if m.config.mask_source == "inputs" else "sign(sum(abs(embedding)))"
    print(f"[{name}] mask_source={m.config.mask_source}: masks used = {used}")
    print(f"    blog rule on embedding+positions: {blog_rule.numpy()[0].astype(int)}"
          f" -> {int(tf.reduce_sum(1 - blog_rule))} of 5 pads masked")
    print(f"    our rule on the embedding:        {ours.numpy()[0].astype(int)}"
          f" -> {int(tf.reduce_sum(1 - ours))} of 5 pads masked")
    print(f"    encoder output at the 4 real tokens, padded to 9 vs unpadded: max |diff| = {diff:.2e}")
    # first encoder block's self-attention: how much of each real query's attention goes to the 5 pads
    block_masks = None if m.config.mask_source == "inputs" else ours     # None: recomputed from x (the blog)
    w = m.encoder_blocks[0].self_attention.attention_weights(with_positions, with_positions, block_masks, block_masks)
    print(f"    share of the real tokens' attention on pads (block 1, mean over heads): "
          f"{float(tf.reduce_mean(tf.reduce_sum(w[0, :, :4, 4:], axis=-1))):.3f}")"""),
    ("code", r"""row = tf.constant([[[0.5, -0.5, 1.0, -1.0], [0.5, 0.2, 0.1, 0.0]]])    # two real tokens, the first sums to 0
print("blog rule sign(abs(sum(x))):", modules.key_masks_from_inputs(row).numpy()[0],
      "| our rule sign(sum(abs(x))):", modules.masks_from_embedding(row).numpy()[0])

learned = models["blog"].enc_positions(tf.zeros([1, 14], tf.int32))[0]   # maxlen 10, 14 positions asked
sinusoid = models["default"].enc_positions(tf.zeros([1, 14], tf.int32))[0]
print("blog (learned, maxlen 10): positions 10-13 repeat row 9:",
      bool(tf.reduce_all(learned[10:] == learned[9])))
print("default (sinusoid): positions 9-13 all distinct:",
      len({tuple(np.round(r, 6)) for r in sinusoid[9:].numpy()}) == 5)

blog_attention = models["blog"].encoder_blocks[0].self_attention
default_attention = models["default"].encoder_blocks[0].self_attention
print("Q/K/V activation   default:", default_attention.qkv_activation, "| blog:", blog_attention.qkv_activation)
print("W^O                default:", default_attention.output_projection, "| blog:", blog_attention.output_projection)
print(f"notebook ran in {time.monotonic() - STARTED:.1f}s")"""),
]


def build():
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    notebook.metadata["language_info"] = {"name": "python"}
    notebook.cells = [nbformat.v4.new_markdown_cell(text) if kind == "md" else nbformat.v4.new_code_cell(text)
                      for kind, text in CELLS]
    return notebook


def execute(notebook, timeout=300):
    """Runs every cell in a fresh ``python3`` kernel with cwd = the repository root; raises on a cell error."""
    from nbclient import NotebookClient

    # The kernel starts as a command does: quiet unless told otherwise (the first cell calls quiet_tensorflow).
    env = {name: value for name, value in os.environ.items() if name not in ("TF_CPP_MIN_LOG_LEVEL", QUIET)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    # The ``python3`` kernel spec that ipykernel provides runs this interpreter (sys.executable).
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": ROOT}})
    client.execute(env=env)
    return notebook


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-run", action="store_true", help="write the cells without executing them")
    parser.add_argument("--output", default=NOTEBOOK)
    args = parser.parse_args(argv)
    notebook = build()
    if not args.no_run:
        started = time.monotonic()
        execute(notebook)
        print(f"executed in {time.monotonic() - started:.1f}s")
    nbformat.validate(notebook)
    nbformat.write(notebook, args.output)
    print(f"wrote {args.output} ({os.path.getsize(args.output) / 1024:.0f} KiB)")


if __name__ == "__main__":
    sys.exit(main())
