"""Decoding speed of the Python model: sentences/s and generated tokens/s, one run.

On the small configuration the peers' figures are for (vocabulary 8000, 256
units, 4 heads, d_ff 1024, 3+3 blocks: the ``small`` preset with these values
pinned; random weights, seeded) and a batch of sentences from the embedded
corpus' dev split (SentencePiece trained on its train split), it times:

* ``uncached greedy``: :func:`~tf_transformer.infer.decode.greedy_decode`, the
  reference that re-reads the whole prefix at every step;
* ``cached greedy`` and ``beam 4``: :func:`~tf_transformer.infer.decode.generate`;
* the peers, at the same configuration and random weights:
  ``keras-hub greedy`` and ``keras-hub beam 4``: keras-hub's own cached
  decoding (``TransformerEncoder``/``TransformerDecoder`` with their key/value
  caches, ``GreedySampler`` or ``BeamSampler(num_beams=4)``, in one
  ``tf.function``), and the same compiled with XLA (``... XLA``), as
  keras-hub's own ``generate()`` does by default; ``tf-models greedy`` and
  ``tf-models beam 4``: tf-models' ``Seq2SeqTransformer`` and its own cached
  beam search (greedy is its beam search with one beam). A peer that does not
  import is skipped with the pip command;

(a) on ``--sentences`` sentences with ``--tokens`` new tokens each and (b) on the
same sentences with ``--long-tokens`` new tokens (uncached against cached).
Lengths are forced: the ``</S>`` logit is masked (output bias -1e9), so no
hypothesis ever ends and every method generates exactly ``max_length`` tokens
per sentence (keras-hub: no stop token; tf-models: its end id is one no step
can produce). The ratios compare ours with the fastest peer method of the
same decoder (greedy, beam 4). Each figure is the best of
``--repeats`` timed runs after one untimed warm-up run (tracing).

    python bench/decode.py
    python bench/decode.py --sentences 64 --tokens 24 --long-tokens 32 --repeats 5 --json decode.json
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.peers import keras_hub_missing, tf_keras_policy, tf_models_missing, tf_models_transformer  # noqa: E402
from tf_transformer.data import corpus, data_load  # noqa: E402
from tf_transformer.data.tokenizer import train_tokenizers  # noqa: E402
from tf_transformer.data.vocab import BOS_ID, EOS_ID  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.infer.decode import generate, greedy_decode  # noqa: E402
from tf_transformer.model_dir import checkpoint_files

# The configuration compared with keras-hub and tf-models, whatever the preset's defaults become.
PEERS = ("keras-hub", "tf-models")
CONFIG = ["vocab_size=8000", "num_units=256", "num_heads=4", "d_ff=1024", "num_blocks=3"]


def best_times(methods, repeats):
    """The fastest of ``repeats`` runs of each ``methods[name]()``, after one warm-up run
    each (tracing), in wall-clock seconds and in CPU seconds of this process (all its
    threads: what a machine busy with other work inflates least). The methods take
    turns, so that such work slows them alike.

    Returns ({name: (wall seconds, cpu seconds)}, {name: last result}).
    """
    results = {name: fn() for name, fn in methods.items()}
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, fn in methods.items():
            wall, cpu = time.perf_counter(), time.process_time()
            results[name] = fn()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}, results


def source_batch(hp, sentences):
    """(tokenizers, (sentences, T_x) int32 ids) of the first dev sentences of the embedded corpus."""
    splits = corpus.corpus_splits(corpus.DEFAULT_CORPUS)
    tokenizers = train_tokenizers(hp, splits["train"].read().pairs)
    dev = [source for source, _ in splits["dev"].read().pairs[:sentences]]
    return tokenizers, data_load.tokenize_with_eos(tokenizers[0], dev).to_tensor()


def forced_length_model(hp, tokenizers):
    """The small model with random weights and its ``</S>`` logit masked, so decoding never stops early."""
    keras.utils.set_random_seed(hp.seed)
    return mask_end(checkpoint_files.build_model(hp, *tokenizers))


def mask_end(model):
    """Sets the ``</S>`` output bias of a built :class:`~tf_transformer.nn.model.Transformer` to -1e9
    (its decoding never stops early); returns the model."""
    bias = model.logits_layer.bias.numpy()
    bias[EOS_ID] = -1e9
    model.logits_layer.bias.assign(bias)
    return model


def keras_hub_decoder(hp, vocab_size, source_length, tokens, beam_size=1):
    """keras-hub's cached decoding at the model's configuration, or None without keras_hub.

    Returns ``generate(x) -> (N, tokens) ids``, to be wrapped in a ``tf.function``:
    encoder once, the cross-attention caches filled by one ``<S>`` step (as
    keras-hub's seq2seq models prefill), then ``GreedySampler`` (``beam_size``
    1) or ``BeamSampler(num_beams=beam_size)`` over the self-attention caches.
    For beams the encoder output, its padding and the cross-attention caches
    are repeated once per beam before the loop (they are the same for every
    beam of a sentence), so the sampler reorders only the self-attention caches.
    """
    try:
        import keras_hub
    except ImportError:
        return None
    keras.utils.set_random_seed(hp.seed)
    layers = keras_hub.layers
    units, heads, blocks = hp.num_units, hp.num_heads, hp.num_blocks
    source_embedding = layers.TokenAndPositionEmbedding(vocab_size, source_length, units)
    target_embedding = layers.TokenAndPositionEmbedding(vocab_size, tokens + 1, units)
    encoders = [layers.TransformerEncoder(hp.d_ff, heads) for _ in range(blocks)]
    decoders = [layers.TransformerDecoder(hp.d_ff, heads) for _ in range(blocks)]
    logits_layer = keras.layers.Dense(vocab_size)
    sampler = (keras_hub.samplers.GreedySampler() if beam_size == 1
               else keras_hub.samplers.BeamSampler(num_beams=beam_size))

    def decoder_step(ids, memory, source_padding, self_caches, cross_caches, index, cross_index):
        """(N, 1) ids at ``index`` -> (N, V) logits and the updated caches."""
        dec = target_embedding(ids, start_index=index)
        new_self, new_cross = [], []
        for decoder, self_cache, cross_cache in zip(decoders, self_caches, cross_caches):
            dec, self_cache, cross_cache = decoder(
                dec, memory, encoder_padding_mask=source_padding, self_attention_cache=self_cache,
                self_attention_cache_update_index=index, cross_attention_cache=cross_cache,
                cross_attention_cache_update_index=cross_index)
            new_self.append(self_cache)
            new_cross.append(cross_cache)
        return logits_layer(dec)[:, 0], new_self, new_cross

    def generate(x):
        n = tf.shape(x)[0]
        source_padding = tf.not_equal(x, 0)
        memory = source_embedding(x)
        for encoder in encoders:
            memory = encoder(memory, padding_mask=source_padding)
        head_dim = units // heads
        self_caches = [tf.zeros([n, 2, tokens + 1, heads, head_dim]) for _ in decoders]
        cross_caches = [tf.zeros([n, 2, source_length, heads, head_dim]) for _ in decoders]
        prompt = tf.concat([tf.fill([n, 1], BOS_ID), tf.zeros([n, tokens], tf.int32)], axis=1)
        _, self_caches, cross_caches = decoder_step(prompt[:, :1], memory, source_padding, self_caches,
                                                    cross_caches, 0, 0)
        if beam_size > 1:  # the sampler repeats prompt and self caches per beam; these follow its order
            memory, source_padding = tf.repeat(memory, beam_size, 0), tf.repeat(source_padding, beam_size, 0)
            cross_caches = [tf.repeat(c, beam_size, 0) for c in cross_caches]

        def next_logits(prompt, cache, index):
            ids = tf.slice(prompt, [0, index - 1], [-1, 1])
            logits, self_cache, _ = decoder_step(ids, memory, source_padding, list(cache), cross_caches,
                                                 index - 1, None)
            return logits, None, tuple(self_cache)

        return sampler(next_logits, prompt, cache=tuple(self_caches), index=1)[:, 1:]

    return generate


def tf_models_decoder(hp, vocab_size, tokens, beam_size):
    """tf-models' ``Seq2SeqTransformer`` decoding (its own cached beam search; ``beam_size`` 1 is its
    greedy) at the model's configuration, random weights, exactly ``tokens`` new tokens a sentence
    (:func:`bench.peers.tf_models_transformer`); None when tf-models does not import.

    Returns ``generate(x) -> (N, tokens) ids``, to be wrapped in a ``tf.function``.
    """
    if tf_models_missing():
        return None
    import tf_keras

    tf_keras.utils.set_random_seed(hp.seed)
    with tf_keras_policy("float32"):
        model = tf_models_transformer(hp, vocab_size, decode_length=tokens, beam_size=beam_size)
    return lambda x: model({"inputs": x})["outputs"]


def peer_decoders(hp, vocab_size, source_length, tokens, beam_size):
    """{(name, tokens): generate(x)} for every peer that imports, and a list of lines for those skipped."""
    source_spec = [tf.TensorSpec([None, source_length], tf.int32)]
    found, skipped = {}, []
    for beams, decoder in ((1, "greedy"), (beam_size, f"beam {beam_size}")):
        generate = keras_hub_decoder(hp, vocab_size, source_length, tokens, beams)
        if generate is None:
            skipped.append(f"keras-hub {decoder} skipped: keras_hub does not import ({keras_hub_missing()}); "
                           "pip install -r bench/requirements.txt")
        else:
            found["keras-hub " + decoder] = tf.function(generate, input_signature=source_spec)
            found[f"keras-hub {decoder} XLA"] = tf.function(generate, input_signature=source_spec, jit_compile=True)
        generate = tf_models_decoder(hp, vocab_size, tokens, beams)
        if generate is None:
            skipped.append(f"tf-models {decoder} skipped: it does not import ({tf_models_missing()}); "
                           "pip install -r bench/requirements.txt && pip install --no-deps -r "
                           "bench/requirements-no-deps.txt")
        else:
            found["tf-models " + decoder] = tf.function(generate, input_signature=source_spec)
    return found, skipped


def best_peer(figures, decoder, tokens):
    """(name, figure) of the fastest peer method for ``decoder`` ('greedy', 'beam 4') in
    ``figures`` {(method, new tokens): sentences/s}, or None when no peer ran."""
    peers = [(name, value) for (name, t), value in figures.items()
             if t == tokens and name.split(" ", 1)[0] in PEERS and name.split(" ", 1)[1].startswith(decoder)]
    return max(peers, key=lambda peer: peer[1], default=None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per sentence in (a)")
    parser.add_argument("--long-tokens", type=int, default=32, help="new tokens per sentence in (b)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    hp = load_hparams("small", overrides=CONFIG + args.set)
    tokenizers, x = source_batch(hp, args.sentences)
    model = forced_length_model(hp, tokenizers)
    n, repeats = int(x.shape[0]), args.repeats

    def cached(tokens, beam_size=1, jit_compile=False):
        return lambda: generate(model, x, beam_size=beam_size, length_penalty=hp.length_penalty,
                                max_length=tokens, jit_compile=jit_compile)[0].numpy()

    methods = {}  # (name, new tokens) -> a function returning (N, ..., new tokens) ids
    for tokens in (args.tokens, args.long_tokens):
        methods["uncached greedy", tokens] = lambda tokens=tokens: greedy_decode(model, x, tokens)
        methods["cached greedy", tokens] = cached(tokens)
    methods["cached greedy XLA", args.tokens] = cached(args.tokens, jit_compile=True)
    methods[f"beam {args.beam_size}", args.tokens] = cached(args.tokens, args.beam_size)
    methods[f"beam {args.beam_size} XLA", args.tokens] = cached(args.tokens, args.beam_size, jit_compile=True)
    vocab_size = max(tokenizers[0].vocab_size, tokenizers[1].vocab_size)  # tf-models has one vocabulary
    peers, skipped = peer_decoders(hp, vocab_size, int(x.shape[1]), args.tokens, args.beam_size)
    for line in skipped:
        print(line)
    for name, function in peers.items():
        methods[name, args.tokens] = lambda function=function: function(x).numpy()
    seconds, results = best_times(methods, repeats)
    rows = []
    for (name, tokens), ids in results.items():
        assert ids.shape[0] == n and ids.shape[-1] == tokens, (name, ids.shape)
        wall, cpu = seconds[name, tokens]
        rows.append({"method": name, "sentences": n, "new_tokens": tokens, "seconds": round(wall, 4),
                     "cpu_seconds": round(cpu, 4), "sentences_per_s": round(n / wall, 1),
                     "tokens_per_s": round(n * tokens / wall), "sentences_per_cpu_s": round(n / cpu, 1)})

    print(f"small config (vocab {tokenizers[1].vocab_size}, {hp.num_units} units, {hp.num_heads} heads, "
          f"d_ff {hp.d_ff}, {hp.num_blocks}+{hp.num_blocks} blocks), {n} dev sentences of "
          f"{int(x.shape[1])} source tokens at most, forced lengths, best of {repeats}; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'method':<21} {'new tokens':>10} {'seconds':>8} {'sentences/s':>12} {'tokens/s':>9} "
          f"{'CPU s':>7} {'sentences/CPU s':>16}")
    for row in rows:
        print(f"{row['method']:<21} {row['new_tokens']:>10} {row['seconds']:>8.3f} {row['sentences_per_s']:>12.1f} "
              f"{row['tokens_per_s']:>9} {row['cpu_seconds']:>7.3f} {row['sentences_per_cpu_s']:>16.1f}")
    ratios = {}
    for key in ("sentences_per_s", "sentences_per_cpu_s"):
        by = {(row["method"], row["new_tokens"]): row[key] for row in rows}
        for t in (args.tokens, args.long_tokens):
            ratios[f"cached / uncached greedy, {t} tokens, {key}"] = by["cached greedy", t] / by["uncached greedy", t]
        for ours, decoder in (("cached greedy", "greedy"), (f"beam {args.beam_size}", f"beam {args.beam_size}")):
            best = best_peer(by, decoder, args.tokens)
            if best:
                for method in (ours, ours + " XLA"):
                    ratios[f"{method} / best peer ({best[0]}), {key}"] = by[method, args.tokens] / best[1]
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    print("command: python bench/decode.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratios": {k: round(v, 2) for k, v in ratios.items()}, "skipped": skipped}, f,
                      indent=2)


if __name__ == "__main__":
    main()
