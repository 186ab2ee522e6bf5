"""Tests for ``tf_transformer.hparams``: presets, layering, parsing, errors, saving."""

import dataclasses
import re
import os

import pytest
import yaml

from tf_transformer import hparams as hparams_module
from tf_transformer.errors import UserError
from tf_transformer.hparams import HParams, HParamsError, load_hparams
from tf_transformer.presets import PRESETS_PATH, preset_names
from tf_transformer.nn.model import TransformerConfig

PRESETS = ["small", "debian", "toy", "blog", "kyubyong2019", "paper"]


def field_names():
    return [f.name for f in dataclasses.fields(HParams)]


def error_of(**kwargs):
    """The HParamsError that load_hparams(**kwargs) raises."""
    with pytest.raises(HParamsError) as info:
        load_hparams(**kwargs)
    return str(info.value)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---- presets -----------------------------------------------------------------


def test_hparams_error_is_a_user_error():
    assert issubclass(HParamsError, UserError)


def test_preset_names():
    assert preset_names() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads(name):
    hp = load_hparams(name)
    assert isinstance(hp, HParams)
    assert sorted(hp.to_dict()) == sorted(field_names())


def test_defaults_name_every_field_and_nothing_else():
    with open(PRESETS_PATH, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    defaults = doc["defaults"]
    missing = set(field_names()) - set(defaults)
    extra = set(defaults) - set(field_names())
    assert missing == set()
    assert extra == set()
    for name, preset in doc["presets"].items():
        assert set(preset or {}) <= set(field_names()), name


def test_blog_preset():
    hp = load_hparams("blog")
    assert hp.qkv_activation == "relu"
    assert hp.output_projection is False
    assert hp.positional_encoding == "learned"
    assert hp.mask_source == "inputs"
    assert hp.lr_schedule == "constant"
    assert hp.learning_rate == 1e-4
    assert hp.adam_beta2 == 0.98
    assert hp.adam_epsilon == 1e-8
    assert hp.dropout_rate == 0.1
    assert (hp.num_blocks, hp.num_units, hp.num_heads, hp.d_ff) == (6, 512, 8, 2048)
    # The blog's data: whitespace words, batches of 32 sentences padded to maxlen.
    assert (hp.tokenizer, hp.batch_tokens, hp.batch_size, hp.pad_to_maxlen) == ("word", 0, 32, True)


def test_paper_preset():
    hp = load_hparams("paper")
    assert hp.output_projection is True
    assert hp.qkv_activation is None
    assert hp.positional_encoding == "sinusoid"
    assert hp.lr_schedule == "noam"
    assert hp.warmup_steps == 4000
    # init_lr = d_model^-0.5 * warmup^-0.5 = (512 * 4000)^-0.5
    assert hp.learning_rate == pytest.approx((512 * 4000) ** -0.5, rel=1e-3)


def test_kyubyong2019_preset():
    hp = load_hparams("kyubyong2019")
    assert hp.lr_schedule == "noam"
    assert hp.learning_rate == 3e-4
    assert hp.warmup_steps == 4000
    assert hp.dropout_rate == 0.3
    assert hp.output_projection is False
    assert hp.qkv_activation is None


def test_default_preset_is_small():
    hp = load_hparams()
    assert hp == load_hparams("small")
    assert hp.mask_source == "embedding"
    assert hp.num_blocks == 3
    assert hp.num_units == 256
    assert (hp.tokenizer, hp.vocab_size, hp.batch_tokens, hp.pad_to_maxlen) == ("sentencepiece", 4000, 1024, False)


def test_toy_preset_changes_only_its_keys():
    toy = load_hparams("toy")
    small = load_hparams("small")
    assert (toy.num_blocks, toy.num_units, toy.d_ff, toy.maxlen) == (2, 32, 64, 20)
    # Keys the toy preset does not name keep the defaults.
    assert toy.seed == small.seed == 42
    assert toy.vocab_size == small.vocab_size == 4000


# ---- layering ----------------------------------------------------------------


def test_layering_preset_then_config_then_set(tmp_path):
    config = write(tmp_path / "c.yaml", "num_blocks: 5\nd_ff: 128\nlearning_rate: 2.0e-3\n")
    hp = load_hparams("toy", config=config, overrides=["num_blocks=7"])
    assert hp.num_blocks == 7  # --set beats the config file
    assert hp.d_ff == 128  # the config file beats the preset (toy: 64)
    assert hp.learning_rate == 2e-3  # the config file beats the preset (toy: 3e-3)
    assert hp.num_units == 32  # the preset beats the defaults (256)
    assert hp.seed == 42  # defaults
    without_set = load_hparams("toy", config=config)
    assert without_set.num_blocks == 5


def test_later_set_wins():
    hp = load_hparams(overrides=["num_blocks=2", "num_blocks=5"])
    assert hp.num_blocks == 5


def test_empty_config_file_changes_nothing(tmp_path):
    config = write(tmp_path / "empty.yaml", "")
    assert load_hparams("toy", config=config) == load_hparams("toy")


# ---- --set parsing -----------------------------------------------------------


def test_set_int():
    hp = load_hparams(overrides=["num_blocks=2"])
    assert hp.num_blocks == 2
    assert type(hp.num_blocks) is int


def test_set_float_in_exponent_notation():
    # YAML 1.1 reads "1e-4" (no dot) as a string; it must still become 1e-4.
    assert yaml.safe_load("1e-4") == "1e-4"
    hp = load_hparams(overrides=["learning_rate=1e-4"])
    assert hp.learning_rate == 1e-4
    assert type(hp.learning_rate) is float


def test_set_float_plain():
    hp = load_hparams(overrides=["dropout_rate=0.25"])
    assert hp.dropout_rate == 0.25


def test_set_int_accepted_for_float_key():
    hp = load_hparams(overrides=["learning_rate=1"])
    assert hp.learning_rate == 1.0
    assert type(hp.learning_rate) is float


@pytest.mark.parametrize("raw,expected", [("false", False), ("true", True), ("False", False)])
def test_set_bool(raw, expected):
    hp = load_hparams(overrides=[f"output_projection={raw}"])
    assert hp.output_projection is expected


def test_set_null_qkv_activation():
    hp = load_hparams("blog", overrides=["qkv_activation=null"])
    assert hp.qkv_activation is None
    hp = load_hparams(overrides=["qkv_activation=relu"])
    assert hp.qkv_activation == "relu"


def test_set_choice():
    hp = load_hparams(overrides=["positional_encoding=learned", "lr_schedule=constant"])
    assert hp.positional_encoding == "learned"
    assert hp.lr_schedule == "constant"


def test_set_strips_spaces_around_key():
    hp = load_hparams(overrides=[" num_blocks = 4"])
    assert hp.num_blocks == 4


# ---- errors ------------------------------------------------------------------


def test_unknown_key_in_set_suggests():
    message = error_of(overrides=["num_block=2"])
    assert "num_block=2" in message  # the source: the --set item
    assert "'num_block'" in message
    assert "did you mean 'num_blocks'" in message


def test_unknown_key_without_close_match_lists_keys():
    message = error_of(overrides=["zzzzzz=1"])
    assert "'zzzzzz'" in message
    assert "num_blocks" in message and "seed" in message


def test_unknown_key_in_config_names_file(tmp_path):
    config = write(tmp_path / "bad.yaml", "num_blocks: 2\nnum_unit: 64\n")
    message = error_of(config=config)
    assert config in message
    assert "'num_unit'" in message
    assert "did you mean 'num_units'" in message


def test_wrong_type_int():
    message = error_of(overrides=["num_blocks=two"])
    assert "num_blocks" in message
    assert "'two'" in message
    assert "--set num_blocks=two" in message
    assert "integer" in message


def test_float_rejected_for_int_key():
    message = error_of(overrides=["num_blocks=2.5"])
    assert "num_blocks" in message and "integer" in message


def test_bool_rejected_for_int_and_float_keys():
    assert "num_blocks" in error_of(overrides=["num_blocks=true"])
    assert "dropout_rate" in error_of(overrides=["dropout_rate=true"])


def test_wrong_type_bool():
    message = error_of(overrides=["output_projection=maybe"])
    assert "output_projection" in message
    assert "'maybe'" in message
    assert "true or false" in message


def test_bad_choice_lists_choices():
    message = error_of(overrides=["positional_encoding=rotary"])
    assert "positional_encoding" in message
    assert "'rotary'" in message
    assert "'sinusoid'" in message and "'learned'" in message


def test_bad_choice_qkv_activation_lists_null():
    message = error_of(overrides=["qkv_activation=gelu"])
    assert "qkv_activation" in message
    assert "'relu'" in message and "null" in message


def test_num_units_not_divisible_by_num_heads():
    message = error_of(overrides=["num_heads=3"])  # small: num_units=256
    assert "num_units=256" in message
    assert "num_heads=3" in message
    # Divisors of 256 up to 64.
    assert "[1, 2, 4, 8, 16, 32, 64]" in message


def test_num_units_not_divisible_names_both_when_units_set():
    message = error_of(overrides=["num_units=30"])  # num_heads=4
    assert "num_units=30" in message and "num_heads=4" in message
    assert "[1, 2, 3, 5, 6, 10, 15, 30]" in message


def test_negative_dropout():
    message = error_of(overrides=["dropout_rate=-0.1"])
    assert "dropout_rate=-0.1" in message
    assert "[0, 1)" in message


@pytest.mark.parametrize("key", ["dropout_rate", "residual_dropout_rate", "label_smoothing"])
def test_dropout_at_least_one(key):
    message = error_of(overrides=[f"{key}=1.0"])
    assert key in message
    assert "[0, 1)" in message


def test_dropout_just_below_one_is_accepted():
    assert load_hparams(overrides=["dropout_rate=0.99"]).dropout_rate == 0.99


def test_zero_learning_rate():
    message = error_of(overrides=["learning_rate=0"])
    assert "learning_rate" in message
    assert "greater than 0" in message


def test_zero_num_blocks():
    message = error_of(overrides=["num_blocks=0"])
    assert "num_blocks=0" in message


@pytest.mark.parametrize("size", [4, 0, -1])
def test_vocab_size_too_small(size):
    message = error_of(overrides=[f"vocab_size={size}"])
    assert f"vocab_size={size}" in message


@pytest.mark.parametrize("tokens", [-1, 1, 99])
def test_batch_tokens_below_maxlen_is_refused(tokens):
    message = error_of(overrides=[f"batch_tokens={tokens}", "maxlen=100"])
    assert f"batch_tokens={tokens}" in message and "maxlen=100" in message


@pytest.mark.parametrize("tokens", [0, 100, 4096])
def test_batch_tokens_zero_or_at_least_maxlen_is_accepted(tokens):
    assert load_hparams(overrides=[f"batch_tokens={tokens}", "maxlen=100"]).batch_tokens == tokens


def test_tokenizer_choices_are_listed():
    message = error_of(overrides=["tokenizer=bpe"])
    assert "'word'" in message and "'sentencepiece'" in message


def test_vocab_size_five_is_accepted():
    assert load_hparams(overrides=["vocab_size=5"]).vocab_size == 5


def test_unknown_preset_lists_presets():
    message = error_of(preset="nope")
    assert "'nope'" in message
    for name in PRESETS:
        assert name in message


def test_set_without_equals():
    message = error_of(overrides=["num_blocks"])
    assert "num_blocks" in message
    assert "key=value" in message


def test_config_not_valid_yaml_names_file_and_line(tmp_path):
    config = write(tmp_path / "broken.yaml", "num_blocks: 2\nnum_units: 64: 3\nd_ff: 8\n")
    message = error_of(config=config)
    assert f"{config}:2" in message
    assert "YAML" in message


@pytest.mark.parametrize("text,fragment", [
    ("output_projection: maybe\n", "output_projection"),  # a wrong type
    ("- num_blocks\n- 2\n", "mapping"),                   # a list
    ("hello\n", "mapping"),                                # a scalar
])
def test_bad_config_file_is_named(tmp_path, text, fragment):
    config = write(tmp_path / "c.yaml", text)
    message = error_of(config=config)
    assert config in message
    assert fragment in message


def test_missing_config_file(tmp_path):
    config = str(tmp_path / "nope.yaml")
    message = error_of(config=config)
    assert config in message
    assert "not found" in message


def test_config_that_is_a_directory(tmp_path):
    message = error_of(config=str(tmp_path))
    assert str(tmp_path) in message


def test_config_not_utf8(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"num_blocks: 2\n# caf\xe9\n")
    message = error_of(config=str(path))
    assert str(path) in message


def test_bad_presets_file(tmp_path):
    presets = write(tmp_path / "p.yaml", "presets: {}\n")
    message = error_of(presets_path=presets)
    assert presets in message
    assert "defaults" in message


# ---- save / load / replace ---------------------------------------------------


@pytest.mark.parametrize("name", PRESETS)
def test_save_load_round_trip(tmp_path, name):
    hp = load_hparams(name, overrides=["learning_rate=1.2345e-4", "seed=7"])
    path = str(tmp_path / "hparams.yaml")
    hp.save(path)
    again = load_hparams(config=path)  # default preset underneath: every key is overwritten
    assert again == hp
    assert again.to_dict() == hp.to_dict()
    for key, value in hp.to_dict().items():
        assert type(getattr(again, key)) is type(value), key


def test_saved_file_is_flat_and_complete(tmp_path):
    path = tmp_path / "hparams.yaml"
    load_hparams("blog").save(str(path))
    saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert list(saved) == field_names()
    assert saved["qkv_activation"] == "relu"
    assert saved["output_projection"] is False


def test_save_leaves_no_temporary_file(tmp_path):
    load_hparams("toy").save(str(tmp_path / "hparams.yaml"))
    assert os.listdir(tmp_path) == ["hparams.yaml"]


def test_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "hparams.yaml"
    load_hparams("toy").save(str(path))
    before = path.read_text(encoding="utf-8")

    def failing_replace(src, dst, *args, **kwargs):
        raise OSError("simulated crash during rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated crash"):
        load_hparams("blog").save(str(path))
    monkeypatch.undo()

    assert path.read_text(encoding="utf-8") == before
    assert os.listdir(tmp_path) == ["hparams.yaml"]
    assert load_hparams(config=str(path)) == load_hparams("toy")


def test_replace_applies_and_copies():
    hp = load_hparams("toy")
    new = hp.replace(num_blocks=4, learning_rate="1e-4")
    assert new.num_blocks == 4
    assert new.learning_rate == 1e-4
    assert hp.num_blocks == 2  # the original is unchanged
    assert new.num_units == hp.num_units


def test_replace_int_for_float():
    new = load_hparams("toy").replace(dropout_rate=0)
    assert new.dropout_rate == 0.0
    assert type(new.dropout_rate) is float


def test_replace_unknown_key():
    with pytest.raises(HParamsError) as info:
        load_hparams("toy").replace(num_block=4)
    assert "replace()" in str(info.value)
    assert "did you mean 'num_blocks'" in str(info.value)


def test_replace_wrong_type():
    with pytest.raises(HParamsError, match="num_blocks"):
        load_hparams("toy").replace(num_blocks="two")


def test_replace_checks_ranges():
    with pytest.raises(HParamsError, match=r"num_units=32 is not divisible by num_heads=3"):
        load_hparams("toy").replace(num_heads=3)
    with pytest.raises(HParamsError, match="dropout_rate"):
        load_hparams("toy").replace(dropout_rate=1.5)


def test_architecture_keys_are_fields():
    assert set(hparams_module.ARCHITECTURE_KEYS) <= set(field_names())


def test_shared_embeddings_need_the_joint_sentencepiece_vocabulary():
    with pytest.raises(HParamsError, match="shared_embeddings=true needs one vocabulary for both languages: "
                                           "tokenizer=sentencepiece"):
        load_hparams(overrides=["shared_embeddings=true", "tokenizer=word"])
    assert load_hparams(overrides=["shared_embeddings=true"]).shared_embeddings


def test_model_config_defaults_are_the_yaml_defaults():
    """A Transformer built without a config is the model of hparams.yaml's defaults."""
    with open(PRESETS_PATH, encoding="utf-8") as f:
        defaults = yaml.safe_load(f)["defaults"]
    assert dataclasses.asdict(TransformerConfig()) == {name: defaults[name] for name in TransformerConfig.names()}


@pytest.mark.parametrize("item, fragment", [
    ("max_length_factor=1e9", "max_length_factor=1000000000.0 must be at most 100"),
    ("max_decode_length=5000", "max_decode_length=5000 must be at most 4096"),
    ("beam_patience=1e9", "beam_patience=1000000000.0 must be at most 100"),
    ("beam_patience=-1", "beam_patience=-1.0 must be 0 or more"),
    ("batch_tokens=3000000000", "batch_tokens=3000000000 must be at most 2147483647"),
    ("shard_pairs=3000000000", "shard_pairs=3000000000 must be at most 2147483647"),
])
def test_values_beyond_what_the_graph_represents_are_refused(item, fragment):
    """Issue 24: values that reach int32 shapes in the graph are bounded where they are checked."""
    with pytest.raises(HParamsError, match=re.escape(fragment)):
        load_hparams("toy", overrides=[item])
