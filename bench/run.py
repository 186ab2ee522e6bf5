"""The bench suite in one command: training, decoding and serving, ours against the peers, one table.

Runs, each in its own process and with its own JSON:

* ``bench/train.py``: training throughput (non-pad target tokens/s) and MFU
  of the real work, ours against keras-hub and tf-models, first on the
  trainer's own batches of the embedded corpus (1024- and 4096-token
  batches, small size), then on synthetic batches (small and base sizes),
  float32 and, where the CPU has bfloat16 instructions, mixed_bfloat16;
* ``bench/step_profile.py``: the share of op time per category (matmuls, loss,
  softmax and masks, layer norm, casts, ...) and the ops run per step of one
  training step under the TensorFlow profiler, ours and the installed peers,
  each precision the CPU has, and two CPU-independent figures of ours (ops of
  the optimized step graph, bytes written by non-matmul ops per target token);
  its table is printed as it runs, not in the summary table;
* ``bench/decode.py``: sentences/s of greedy and beam 4 decoding on the same
  64 dev sentences, every method forced to the same output length;
* ``bench/serving.py``: one-sentence latency of the exported SavedModel;
* ``bench/ct2.py``: our SavedModel against CTranslate2 on the same weights
  (``--model-dir``, a trained model, and ``--data``, its corpus; default a
  random one): conversion check, batch throughput and one-sentence latency,
  one thread per pool and default pools;
* ``bench/real_text.py``: a trained model (``--model-dir``, default ``runs/debian``,
  README command 1's) translating real dev sentences of mixed length through its
  SavedModel, against the forced-length figure of the same model; skipped
  when there is no trained model.

then prints one table (figure, ours, best peer, ratio, goal), the machine and
the command, and writes everything to ``--json``. A peer that is not
installed is reported as skipped, with the pip command.

    python bench/run.py --quick     # a rough figure, a few minutes on 2 cores
    python bench/run.py             # the figures for the README (half an hour or more on 2 cores)
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))

from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
PARTS = ("train", "step_profile", "decode", "serving", "ct2", "real_text")
QUICK_ARGS = {"train": ["--quick"], "step_profile": ["--steps", "2", "--warmup", "1", "--no-graph"], "decode": ["--repeats", "2"],
              "serving": ["--latency-runs", "20", "--repeats", "1"],
              "ct2": ["--sentences", "64", "--latency-runs", "20", "--repeats", "1", "--check-sentences", "100"],
              "real_text": ["--sentences", "128", "--factors", "2"]}
# Parts that take --model-dir and --data; real_text needs a trained model, the others default to a random one.
MODEL_PARTS = ("ct2", "real_text")
REAL_TEXT_MODEL = os.path.join("runs", "debian")
REAL_TEXT_GOAL = 0.5  # beam-4 SavedModel sentences/s on real text over the forced-length figure
GOALS = {"training": 1.5, "greedy": 1.5, "beam": 2.0}  # ours over the best peer
P50_GOAL_MS = 50.0
# Why ours is slower than a peer, and what would close it, for the cases seen so far.
WHY_SLOWER = {
    "XLA": "the peer compiles its whole decoding loop with XLA (keras-hub generate()'s default), which fuses "
           "the many small per-step ops that dominate a 64-sentence batch on a CPU; compare its row with ours "
           "'... XLA' (decode.generate(jit_compile=True)), which compiles ours the same way.",
}
WHY_SLOWER["CTranslate2"] = (
    "CTranslate2 runs a decoding step as a few C++ kernels called directly (fused QKV and bias/activation, its own "
    "cached attention, beam reordering in place), while ours runs each step's dozens of small TensorFlow ops one by "
    "one through the graph executor, whose per-op cost dominates at 256 units; int8 also quarters the weight reads. "
    "translate_xla (the loop compiled by XLA) removes that cost for one sentence; a batch keeps every row to the end "
    "there, so batches are faster through translate, whose finished sentences leave the batch.")
CT2_GOALS = {"batch": 0.5, "p50": 0.67}  # ours / CTranslate2 float32: throughput >= 0.5x, p50 <= 1.5x its p50
CT2_CHECK_GOAL = 0.95
DEFAULT_WHY = "not analysed yet: profile both with the TensorFlow profiler on this figure's workload."


def machine():
    """CPU model, cores, and the versions of TensorFlow, Keras and the peers (None: not installed)."""
    model = cpu_model()
    versions = {}
    for package in ("tensorflow", "keras", "keras-hub", "tf-models-official", "tf-keras", "ctranslate2"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"cpu": model, "cpu_flags": cpu_speed_flags(), "cores": os.cpu_count(), "python": platform.python_version(), **versions}


def run_part(part, extra, json_path, timeout):
    """Runs ``bench/<part>.py`` in a child process, its output shown as it goes; its JSON, or None."""
    command = [sys.executable, os.path.join(BENCH, f"{part}.py"), *extra, "--json", json_path]
    print(f"\n== {part}: {shlex.join(['python', f'bench/{part}.py', *extra])}", flush=True)
    started = time.perf_counter()
    try:
        code = subprocess.run(command, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"{part}: stopped after --part-timeout {timeout:.0f}s", flush=True)
        return None
    print(f"== {part}: {time.perf_counter() - started:.0f}s", flush=True)
    if code != 0 or not os.path.exists(json_path):
        print(f"{part}: failed (exit status {code})", flush=True)
        return None
    with open(json_path) as f:
        return json.load(f)


def training_figures(train):
    """Rows for each batch set (real batches first, in train.py's order), size and precision: ours (the faster
    of XLA off and on) against the best peer on the same batches; MFU of the real (non-pad) work."""
    results = train["results"]
    padding = {s["name"]: s["padding"] for s in train.get("batch_sets", [])}

    def key(r):
        return r["batches"], r["size"], r["precision"]

    rows = []
    for r in results:
        if r["contender"] != "ours" or r["vs_best_peer"] is None:
            continue
        same = [o for o in results if o["contender"] == "ours" and key(o) == key(r) and o["target_tokens_per_sec"]]
        if max(same, key=lambda o: o["target_tokens_per_sec"]) is not r:
            continue
        peer = r["target_tokens_per_sec"] / r["vs_best_peer"]
        peer_mfu = next(o["mfu"] for o in results if o["contender"] == r["best_peer"] and key(o) == key(r))
        batches = f"{r['batches']}-token" if r["batches"].startswith("real") else r["batches"]  # real 1024-token
        pad = f", {padding[r['batches']]:.0%} padding" if r["batches"] in padding else ""
        rows.append({"figure": f"training {r['size']} {r['precision']}, {batches} batches{pad}: target tokens/s "
                               f"(MFU of real work)",
                     "ours": f"{r['target_tokens_per_sec']:,.0f} ({r['mfu']:.0%}){' XLA' if r['xla'] else ''}",
                     "peer": f"{peer:,.0f} ({peer_mfu:.0%}) {r['best_peer']}", "peer_name": r["best_peer"],
                     "ratio": r["vs_best_peer"],
                     "goal": GOALS["training"]})
        bound = next((o for o in results if o["contender"] == "matmuls" and key(o) == key(r)
                      and o["vs_best_peer"] is not None), None)
        if bound:
            rows.append({"figure": "  the bound: the same step's matmuls alone (bench/train_contenders.py matmul_bound_step)",
                         "ours": f"{bound['target_tokens_per_sec']:,.0f} ({bound['mfu']:.0%})",
                         "peer": rows[-1]["peer"], "peer_name": r["best_peer"], "ratio": bound["vs_best_peer"],
                         "goal": None, "met": None})
    return rows


def decoding_figures(decode):
    """Rows for greedy and beam: ours against the fastest peer method of the same decoder."""
    by = {row["method"]: row["sentences_per_s"] for row in decode["rows"] if row["new_tokens"] == min(
        r["new_tokens"] for r in decode["rows"])}
    rows = []
    for key, ratio in decode["ratios"].items():
        if "best peer" not in key or not key.endswith("sentences_per_s"):
            continue
        ours, peer = key.split(" / best peer (")[0], key.split("(")[1].split(")")[0]
        rows.append({"figure": f"decoding {ours}, sentences/s", "ours": f"{by[ours]:,.1f}",
                     "peer": f"{by[peer]:,.1f} {peer}", "peer_name": peer, "ratio": ratio,
                     "goal": GOALS["greedy" if "greedy" in ours else "beam"]})
    return rows


def serving_figures(serving):
    """Rows for the SavedModel's one-sentence p50 latency; the goal is for greedy decoding."""
    return [{"figure": f"SavedModel one sentence, {row['decoder']}, p50 ms", "ours": f"{row['p50_ms']:.1f}",
             "peer": "-", "peer_name": None, "ratio": None,
             **({"goal": f"< {P50_GOAL_MS:.0f} ms", "met": row["p50_ms"] < P50_GOAL_MS} if row["decoder"] == "greedy"
                else {"goal": "-", "met": None})}
            for row in serving["rows"] if "p50_ms" in row]


def ct2_figures(ct2):
    """Rows of bench/ct2.py: the conversion check, then per thread setting and decoder ours (each
    of our signatures) against CTranslate2 float32 (goals) and int8 (shown): batch sentences/s and
    one-sentence p50, its ratio CTranslate2's ms over ours (above 1: ours faster)."""
    rows = []
    for setting in ct2["settings"]:
        check = setting["check"]
        if check:
            rows.append({"figure": f"CTranslate2 conversion: greedy output = ours, {check['sentences']} dev sentences",
                         "ours": f"{check['float32 greedy']:.1%}", "peer": "-", "peer_name": None, "ratio": None,
                         "goal": f">= {CT2_CHECK_GOAL:.0%}", "met": check["float32 greedy"] >= CT2_CHECK_GOAL})
    for setting in ct2["settings"]:
        threads = "1 thread/pool" if setting["threads"] == 1 else f"{setting['threads'] or 'default'} threads"
        by = {(r["contender"], r["decoder"]): r for r in setting["rows"]}
        for (name, decoder), ours in by.items():
            if not name.startswith("ours"):
                continue
            for compute_type, goals in (("float32", CT2_GOALS), ("int8", {})):
                peer = by[f"CTranslate2 {compute_type}", decoder]
                rows += [
                    {"figure": f"{name}, {decoder}, batch of 64, {threads}: sentences/s",
                     "ours": f"{ours['batch_sentences_per_s']:,.1f}",
                     "peer": f"{peer['batch_sentences_per_s']:,.1f} CTranslate2 {compute_type}",
                     "ratio": ours["batch_sentences_per_s"] / peer["batch_sentences_per_s"],
                     "goal": goals.get("batch")},
                    {"figure": f"{name}, {decoder}, one sentence, {threads}: p50 (p99) ms; ratio peer p50 / ours",
                     "ours": f"{ours['p50_ms']:.1f} ({ours['p99_ms']:.1f})",
                     "peer": f"{peer['p50_ms']:.1f} ({peer['p99_ms']:.1f}) CTranslate2 {compute_type}",
                     "ratio": peer["p50_ms"] / ours["p50_ms"], "goal": goals.get("p50")}]
    for row in rows:
        row.setdefault("peer_name", "CTranslate2")
        row.setdefault("why", WHY_SLOWER["CTranslate2"])
    return rows


def real_text_figures(real):
    """Rows of bench/real_text.py: each SavedModel row's sentences/s on real text over the
    forced-length figure of the same model (goal for the length-sorted default signature)."""
    forced = next(row for row in real["rows"] if row["vs_forced"] == 1.0 and row["bleu"] is None)
    return [{"figure": f"real text, beam {real['beam_size']}, {row['method']}: sentences/s (BLEU {row['bleu']:.1f})",
             "ours": f"{row['sentences_per_s']:.1f}", "peer": f"{forced['sentences_per_s']:.1f} forced length",
             "peer_name": None, "ratio": row["vs_forced"],
             "goal": REAL_TEXT_GOAL if row["method"] == "SavedModel serving_default, sorted" else None}
            for row in real["rows"] if row["method"].startswith("SavedModel")]


def why_slower(row):
    """The line explaining a figure where ours is slower than the peer."""
    if row.get("why"):
        return row["why"]
    return WHY_SLOWER["XLA"] if row["peer_name"].endswith("XLA") else DEFAULT_WHY


def table(rows):
    """A markdown table of the rows (sets each peer row's ``met``)."""
    header = ("figure", "ours", "best peer", "ours / peer", "goal", "met")
    lines = []
    for row in rows:
        if row["ratio"] is not None:
            row["met"] = None if row["goal"] is None else row["ratio"] >= row["goal"]
            goal = "-" if row["goal"] is None else f">= {row['goal']}x"
        else:
            goal = row["goal"]
        lines.append((row["figure"], row["ours"], row["peer"],
                      "-" if row["ratio"] is None else f"{row['ratio']:.2f}x", goal,
                      "-" if row["met"] is None else "yes" if row["met"] else "NO"))
    widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in [header] + lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="rough figures in a few minutes: train.py --quick, decode.py --repeats 2, "
                             "serving.py --latency-runs 20 --repeats 1")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--part-timeout", type=float, default=1800,
                        help="seconds a part may take before it is stopped and left out (default: %(default)s)")
    parser.add_argument("--model-dir", help=f"a trained model for the ct2 part (default: a random one) and the "
                                            f"real_text part (default: {REAL_TEXT_MODEL}, skipped if missing)")
    parser.add_argument("--data", help="the corpus of --model-dir, whose dev split those parts translate")
    parser.add_argument("--json", default=os.path.join("bench", "results.json"),
                        help="where to write every figure (default: %(default)s)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        parser.error(f"--parts {args.parts}: {', '.join(unknown) or 'none given'} is not a part; "
                     f"choose from {', '.join(PARTS)}")
    if args.part_timeout <= 0:
        parser.error(f"--part-timeout {args.part_timeout}: must be positive")
    command = shlex.join(["python", "bench/run.py"] + (sys.argv[1:] if argv is None else list(argv)))
    started = time.perf_counter()

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for part in parts:
            extra = QUICK_ARGS[part] if args.quick else []
            if part in MODEL_PARTS:
                extra = extra + [a for flag in ("model_dir", "data") if getattr(args, flag)
                                 for a in (f"--{flag.replace('_', '-')}", getattr(args, flag))]
            if part == "real_text" and not args.model_dir and not os.path.isdir(REAL_TEXT_MODEL):
                print(f"\n== real_text: skipped, no trained model: give --model-dir (and --data, its corpus), "
                      f"or run README command 1 first ({REAL_TEXT_MODEL})", flush=True)
                continue
            results[part] = run_part(part, extra, os.path.join(scratch, f"{part}.json"), args.part_timeout)

    rows = []
    for part, figures in (("train", training_figures), ("decode", decoding_figures), ("serving", serving_figures),
                          ("ct2", ct2_figures), ("real_text", real_text_figures)):
        if results.get(part):
            rows += figures(results[part])
    skipped = sorted(set((results.get("train") or {}).get("skipped", {}))
                     | {line.split(" ")[0] for line in (results.get("decode") or {}).get("skipped", [])}
                     | {line.split(" ")[0] for line in (results.get("ct2") or {}).get("skipped", [])})
    info = machine()
    print(f"\nmachine: {info['cpu']} ({info['cpu_flags']}), {info['cores']} cores; Python {info['python']}, "
          f"TensorFlow {info['tensorflow']}, Keras {info['keras']}, keras-hub {info['keras-hub']}, "
          f"tf-models-official {info['tf-models-official']} (tf-keras {info['tf-keras']}), "
          f"ctranslate2 {info['ctranslate2']}\n")
    print(table(rows))
    explained = set()
    for row in rows:
        if row["ratio"] is not None and row["ratio"] < 1 and row["peer_name"]:
            why = why_slower(row)
            print(f"slower than {row['peer_name']} at '{row['figure']}': {'as above' if why in explained else why}")
            explained.add(why)
    for peer in skipped:
        print(f"{peer} skipped: not importable; pip install -r bench/requirements.txt && "
              f"pip install --no-deps -r bench/requirements-no-deps.txt")
    if (results.get("train") or {}).get("torch_skipped"):
        print("torch skipped: not importable; pip install -r bench/requirements-torch.txt")
    if (results.get("train") or {}).get("bf16_skipped"):
        print(f"training, mixed_bfloat16: {results['train']['bf16_skipped']}")
    print(f"command: {command} ({time.perf_counter() - started:.0f}s)")
    with open(args.json, "w") as f:
        json.dump({"command": command, "machine": info, "seconds": round(time.perf_counter() - started),
                   "figures": rows, "skipped_peers": skipped, "parts": results}, f, indent=2)
    print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
