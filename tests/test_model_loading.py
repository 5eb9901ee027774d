"""A bad model directory gives one clear error naming the file or field."""

import json

import pytest
from safetensors.torch import load_file, save_file

from helpers_models import make_model_dir
from rill.errors import ModelLoadError
from rill.models.loader import load


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("good"), "llama")


def copy_dir(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def test_missing_directory_names_it(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load(tmp_path / "nope")


def test_missing_config_names_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json not found"):
        load(tmp_path)


def test_missing_weights_name_the_expected_files(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load(d)


def test_unsupported_architecture_lists_the_supported_ones(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    edit_config(d, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load(d)


def test_missing_required_field_is_named(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        load(d)


def test_shape_mismatch_names_the_tensor_and_shapes(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    edit_config(d, intermediate_size=96)
    with pytest.raises(ModelLoadError, match=r"model.layers.0.mlp.gate_proj.weight.*\(128, 64\).*\(96, 64\)"):
        load(d)


def test_missing_tensor_is_named(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match="model.layers.1.self_attn.k_proj.weight"):
        load(d)


def test_unsupported_rope_type_is_named(good_dir, tmp_path):
    d = copy_dir(good_dir, tmp_path / "d")
    edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    with pytest.raises(ModelLoadError, match="yarn"):
        load(d)


def test_missing_tokenizer_json_is_named(good_dir, tmp_path):
    from rill import LLM

    d = copy_dir(good_dir, tmp_path / "d")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        LLM(str(d), num_kv_blocks=8)
