"""bench/defaults.py: variants trained for one budget on a corpus without its test split, read back from the logs."""

import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import defaults  # noqa: E402
from tf_transformer.data.corpus import EMBEDDED  # noqa: E402


def test_variants_train_on_train_and_dev_only_and_their_rows_come_from_the_logs(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "dev", "test"):  # dev and test: the toy pairs again
        for language in ("de", "en"):
            shutil.copy(os.path.join(EMBEDDED["toy"], f"train.{language}"), data / f"{split}.{language}")
    out, table = tmp_path / "out", tmp_path / "rows.json"
    defaults.main(["--data", str(data), "--preset", "toy", "--minutes", "0.05", "--only", "slow",
                   "--variant", "slow=learning_rate=1e-6,beam_size=1", "--out", str(out), "--json", str(table)])
    assert sorted(os.listdir(out / "corpus")) == ["dev.de", "dev.en", "train.de", "train.en"]  # never the test split
    rows = json.loads(table.read_text())["rows"]
    [row] = rows
    assert row["variant"] == "slow" and row["overrides"] == "learning_rate=1e-6 beam_size=1"
    assert not row["failed"] and row["steps"] > 0 and row["tokens_per_sec"] > 0
    assert 0 <= row["dev_bleu"] <= 100 and 0 <= row["dev_chrf"] <= 100
    log = (out / "slow.log").read_text()
    assert "learning_rate: 1.0e-06" in (out / "slow" / "hparams.yaml").read_text()
    assert f"dev at step {row['steps']} " in log and "test (" not in log
    printed = capsys.readouterr().out
    assert "| slow | learning_rate=1e-6 beam_size=1 |" in printed and "speed flags:" in printed
