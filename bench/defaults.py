"""How the main job's defaults were chosen: variants of a preset, each trained for the same budget, scored on dev.

Each variant is ``train.py --preset PRESET --set KEY=VALUE ...`` with
``train_minutes=M``, run one after the other in a subprocess (its log in
``OUT/NAME.log``) on a copy of the corpus without its test split, so that the
choice never sees the test split. The table lists every variant's steps, target
tokens/s, dev BLEU/chrF of the run's best checkpoint and of the average of its
last checkpoints (``average_last``; empty when the run kept too few), and the
1-minute load average before and after.

    python bench/defaults.py --data ~/.cache/tf-transformer/debian-de-en --minutes 10
    python bench/defaults.py --data D --minutes 5 --only base,linear --json defaults.json
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.quality import load_average  # noqa: E402
from tf_transformer.cpu import SPEED_FLAGS, cpu_model, cpu_speed_flags  # noqa: E402

# name -> overrides of the preset, in the order they run; "base" is the preset itself. The rest are the
# `debian` preset's alternatives (README, "How the main job's defaults were chosen").
VARIANTS = {
    "base": [],
    "dropout": ["dropout_rate=0.1", "residual_dropout_rate=0.1"],
    "lr-1e-3": ["learning_rate=1e-3"],
    "lr-3e-3": ["learning_rate=3e-3"],
    "linear": ["lr_schedule=linear"],
    "cosine": ["lr_schedule=cosine"],
    "batch-2048": ["batch_tokens=2048"],
    "vocab-8000": ["vocab_size=8000"],
    "no-smoothing": ["label_smoothing=0"],
}

_DEV = re.compile(r"^dev at step (\d+) .*: BLEU ([\d.]+) chrF ([\d.]+)")
_AVERAGE = re.compile(r"^average of the last \d+ checkpoints: dev BLEU ([\d.]+) chrF ([\d.]+)")
_RATE = re.compile(r"\((\d+) target tokens/s")


def dev_only_copy(data, out):
    """``OUT/corpus``: links to the train and dev files of ``data`` (no test split)."""
    copy = os.path.join(out, "corpus")
    os.makedirs(copy, exist_ok=True)
    for name in os.listdir(data):
        if name.split(".")[0] in ("train", "dev") and not os.path.exists(os.path.join(copy, name)):
            os.symlink(os.path.abspath(os.path.join(data, name)), os.path.join(copy, name))
    return copy


def run_variant(name, overrides, preset, data, minutes, out):
    """Trains one variant; returns its row (dict) for the table, read from its log."""
    model_dir, log_path = os.path.join(out, name), os.path.join(out, f"{name}.log")
    shutil.rmtree(model_dir, ignore_errors=True)
    sets = [f"train_minutes={minutes:g}"] + overrides
    command = [sys.executable, os.path.join(REPO, "train.py"), "--preset", preset, "--data", data,
               "--model-dir", model_dir, "--no-progress", "--no-export"] + [a for s in sets for a in ("--set", s)]
    row = {"variant": name, "overrides": " ".join(overrides) or "(preset)", "load_before": load_average()}
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    row["load_after"] = load_average()
    with open(log_path, encoding="utf-8") as log:
        for line in log:
            if (m := _DEV.match(line)):
                row.update(steps=int(m.group(1)), dev_bleu=float(m.group(2)), dev_chrf=float(m.group(3)))
            elif (m := _AVERAGE.match(line)):
                row.update(average_bleu=float(m.group(1)), average_chrf=float(m.group(2)))
            elif (m := _RATE.search(line)):
                row["tokens_per_sec"] = int(m.group(1))
    row["failed"] = code != 0
    return row


def format_row(row):
    def cell(key, fmt="{:.1f}"):
        return fmt.format(row[key]) if key in row else ""
    return (f"| {row['variant']} | {row['overrides']} | {cell('steps', '{}')} | {cell('tokens_per_sec', '{}')} | "
            f"{cell('dev_bleu')} / {cell('dev_chrf')} | {cell('average_bleu')} / {cell('average_chrf')} | "
            f"{row['load_before']:.1f}-{row['load_after']:.1f} |" + (" failed |" if row["failed"] else ""))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a corpus directory with train and dev splits")
    parser.add_argument("--preset", default="debian", help="the preset the variants change (default: %(default)s)")
    parser.add_argument("--minutes", type=float, default=10.0, help="train_minutes of every variant")
    parser.add_argument("--only", help=f"comma-separated variants (default: all: {','.join(VARIANTS)})")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="an extra variant, e.g. --variant wide=num_units=384,d_ff=1536 (repeatable)")
    parser.add_argument("--out", default="/tmp/tf-transformer-defaults", help="model directories and logs")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    variants = dict(VARIANTS)
    for extra in args.variant:
        name, _, overrides = extra.partition("=")
        variants[name] = overrides.split(",")
    names = args.only.split(",") if args.only else list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        parser.error(f"--only: unknown variants {', '.join(unknown)}; known: {', '.join(variants)}")
    os.makedirs(args.out, exist_ok=True)
    data = dev_only_copy(args.data, args.out)
    model, flags = cpu_model(), cpu_speed_flags()
    print(f"CPU: {model}, {os.cpu_count()} cores, speed flags: {flags} (of {' '.join(SPEED_FLAGS)}); "
          f"preset {args.preset}, train_minutes={args.minutes:g}, dev split of {args.data}", flush=True)
    print("| variant | overrides | steps | target tokens/s | dev BLEU / chrF | averaged: dev BLEU / chrF | load |")
    print("|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in names:
        rows.append(run_variant(name, variants[name], args.preset, data, args.minutes, args.out))
        print(format_row(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"cpu": model, "flags": flags, "preset": args.preset, "minutes": args.minutes,
                           "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
