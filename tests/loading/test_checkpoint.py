"""Every Hugging Face checkpoint layout loads to exactly the weights that were saved."""

import json

import numpy as np
import pytest

from minigpt.loading.checkpoint import INDEX_FILE, load_checkpoint
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.gpt2.config import GPT2Config
from minigpt.loading.weights import expected_shapes, params_to_tensors, random_params
from minigpt.loading.safetensors_format import bfloat16_to_float32, float32_to_bfloat16, read_header

CONFIG = GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=2, n_head=2, eos_token_id=31)
PARAMS = random_params(CONFIG, seed=3)


def assert_params_equal(params, expected: dict[str, np.ndarray]) -> None:
    """Bitwise equality, tensor by tensor, and every loaded tensor is float32."""
    tensors = params_to_tensors(params)
    assert tensors.keys() == expected.keys()
    for name, value in tensors.items():
        assert value.dtype == np.float32, name
        np.testing.assert_array_equal(value.view(np.uint32), expected[name].view(np.uint32), err_msg=name)


LAYOUTS = {
    "save_pretrained": {},
    "hub naming": {"prefix": ""},
    "sharded": {"shards": 3},
    "lm_head stored": {"lm_head": True},
    "mask buffers": {"attn_bias": True},
    "hub file": {"prefix": "", "lm_head": True, "attn_bias": True},
    "everything sharded": {"shards": 5, "lm_head": True, "attn_bias": True},
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_every_layout_loads_the_saved_weights_bitwise(tmp_path, layout):
    save_checkpoint(tmp_path, CONFIG, PARAMS, **layout)
    config, params = load_checkpoint(tmp_path)
    assert config == CONFIG
    assert_params_equal(params, params_to_tensors(PARAMS))


@pytest.mark.parametrize("dtype, decoded", [
    ("float16", lambda x: x.astype(np.float16).astype(np.float32)),
    ("bfloat16", lambda x: bfloat16_to_float32(float32_to_bfloat16(x))),
])
def test_half_precision_storage_loads_the_decoded_values(tmp_path, dtype, decoded):
    save_checkpoint(tmp_path, CONFIG, PARAMS, dtype=dtype, lm_head=True, shards=2)
    _, params = load_checkpoint(tmp_path)
    assert_params_equal(params, {name: decoded(value) for name, value in params_to_tensors(PARAMS).items()})


def test_sharded_layout_is_hugging_faces(tmp_path):
    save_checkpoint(tmp_path, CONFIG, PARAMS, shards=3, dtype="float16")
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == {"transformer." + name for name in expected_shapes(CONFIG)}
    assert index["metadata"]["total_size"] == 2 * sum(v.size for v in params_to_tensors(PARAMS).values())
    assert not (tmp_path / "model.safetensors").exists()


def test_mask_buffers_are_the_hub_files(tmp_path):
    save_checkpoint(tmp_path, CONFIG, PARAMS, prefix="", attn_bias=True)
    header = read_header(tmp_path / "model.safetensors")
    assert header["h.1.attn.bias"].shape == (1, 1, 16, 16) and header["h.1.attn.bias"].dtype == "F32"
    assert header["h.1.attn.masked_bias"].shape == ()
    safe_open = pytest.importorskip("safetensors", reason="reads the header metadata").safe_open
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor("h.1.attn.bias")[0, 0], np.tril(np.ones((16, 16))))
        assert f.get_tensor("h.1.attn.masked_bias") == np.float32(-1e4)


def hf_model(config: GPT2Config):
    """A randomly initialised transformers GPT2LMHeadModel of `config`'s sizes."""
    transformers = pytest.importorskip("transformers", reason="transformers is the reference GPT-2")
    hf_config = transformers.GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.n_positions, n_embd=config.n_embd,
        n_layer=config.n_layer, n_head=config.n_head, bos_token_id=config.eos_token_id,
        eos_token_id=config.eos_token_id,
    )
    return transformers.GPT2LMHeadModel(hf_config).eval()


def hf_tensors(model) -> dict[str, np.ndarray]:
    """The model's state dict as arrays under minigpt's (unprefixed) names, lm_head.weight included."""
    return {name.removeprefix("transformer."): value.numpy() for name, value in model.state_dict().items()}


def test_loads_what_transformers_save_pretrained_writes(tmp_path):
    model = hf_model(CONFIG)
    model.save_pretrained(tmp_path)
    config, params = load_checkpoint(tmp_path)
    assert config == CONFIG
    state = hf_tensors(model)
    assert_params_equal(params, {name: state[name] for name in expected_shapes(CONFIG)})


@pytest.mark.parametrize("layout", [{}, {"prefix": "", "attn_bias": True}, {"shards": 3, "lm_head": True}],
                         ids=["save_pretrained", "hub file", "sharded"])
def test_transformers_loads_what_we_save(tmp_path, layout):
    model = hf_model(CONFIG)
    save_checkpoint(tmp_path, CONFIG, PARAMS, **layout)
    state = hf_tensors(type(model).from_pretrained(tmp_path))
    assert_params_equal(PARAMS, {name: state[name] for name in expected_shapes(CONFIG)})
    np.testing.assert_array_equal(state["lm_head.weight"], PARAMS.wte)


def mapped_files() -> set[str]:
    """The files this process has mapped (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split(maxsplit=5)) == 6}


@pytest.mark.parametrize("shards", [1, 3])
def test_float32_weights_are_every_shard_mapped_read_only_not_copied(tmp_path, shards):
    save_checkpoint(tmp_path, CONFIG, PARAMS, shards=shards)
    _, params = load_checkpoint(tmp_path)
    files = sorted(str(p.resolve()) for p in tmp_path.glob("*.safetensors"))
    assert len(files) == shards and set(files) <= mapped_files()
    for name, value in params_to_tensors(params).items():
        assert not value.flags.owndata and not value.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):  # nothing is written through the map
            value.reshape(-1)[:1] = 0


def test_logits_are_bitwise_the_same_from_the_map_and_from_a_copy_in_memory(tmp_path):
    from minigpt.exact.kernels import EXACT
    from minigpt.gpt2.forward import GPT2, forward
    from minigpt.loading.weights import params_from_tensors
    save_checkpoint(tmp_path, CONFIG, PARAMS)
    config, mapped = load_checkpoint(tmp_path)
    copied = params_from_tensors(config, {name: np.array(v) for name, v in params_to_tensors(mapped).items()})
    ids = np.arange(CONFIG.n_positions) % CONFIG.vocab_size
    a, b = forward(GPT2(config, mapped, EXACT), ids), forward(GPT2(config, copied, EXACT), ids)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_a_checkpoint_renamed_over_while_mapped_leaves_the_process_on_the_old_bytes(tmp_path):
    save_checkpoint(tmp_path, CONFIG, PARAMS)
    _, old = load_checkpoint(tmp_path)
    new = random_params(CONFIG, seed=4)
    save_checkpoint(tmp_path, CONFIG, new)  # a new file renamed into place, as huggingface_hub writes
    assert_params_equal(old, params_to_tensors(PARAMS))
    assert_params_equal(load_checkpoint(tmp_path)[1], params_to_tensors(new))


def test_a_mapped_file_truncated_under_the_process_kills_it_with_sigbus_on_the_lost_pages(tmp_path):
    import signal
    import subprocess
    import sys
    save_checkpoint(tmp_path, CONFIG, PARAMS)
    script = ("import os, sys\nfrom minigpt.loading.checkpoint import load_checkpoint\n"
              "_, params = load_checkpoint(sys.argv[1])\n"
              "os.truncate(os.path.join(sys.argv[1], 'model.safetensors'), 8)\n"
              "print(float(params.wte.sum()))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGBUS and not done.stdout, done
