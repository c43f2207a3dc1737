"""minigpt's own safetensors reader and writer agree with the official package, byte for byte."""

import numpy as np
import pytest

from minigpt.errors import CheckpointError
from minigpt.loading.safetensors_format import (
    bfloat16_to_float32, float32_to_bfloat16, read_header, read_safetensors, write_safetensors,
)

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors is the reference implementation")


def sample_tensors() -> dict[str, np.ndarray]:
    """Tensors of every awkward shape: matrix, vector, scalar, empty, and a non-contiguous view."""
    rng = np.random.default_rng(0)
    return {
        "matrix": rng.standard_normal((5, 7), dtype=np.float32),
        "vector": rng.standard_normal(3, dtype=np.float32) * np.float32(1e3),
        "scalar": np.array(-1e4, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "transposed": rng.standard_normal((4, 6), dtype=np.float32).T,
    }


def bfloat16_rounded(x: np.ndarray) -> np.ndarray:
    return bfloat16_to_float32(float32_to_bfloat16(x))


DECODED = {
    "float32": lambda x: x,
    "float16": lambda x: x.astype(np.float16).astype(np.float32),
    "bfloat16": bfloat16_rounded,
}


@pytest.mark.parametrize("dtype", DECODED)
def test_round_trip_gives_the_stored_values_as_float32_mapped_read_only_or_decoded_fresh(tmp_path, dtype):
    tensors = sample_tensors()
    write_safetensors(tmp_path / "t.safetensors", tensors, dtype)
    loaded = read_safetensors(tmp_path / "t.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        got = loaded[name]
        assert got.dtype == np.float32 and got.flags.c_contiguous, name
        if dtype == "float32" and got.size:  # the file's bytes, mapped: nothing copied, nothing written back
            assert not got.flags.owndata, name
            assert not got.flags.writeable, name
        elif dtype != "float32":  # decoded once into memory of its own
            assert got.flags.owndata and got.flags.writeable, name
        np.testing.assert_array_equal(got, DECODED[dtype](value), strict=True)


def test_bfloat16_rounds_to_nearest_even_on_hand_computed_cases():
    cases = {
        1.0: 0x3F80,
        1 + 2**-8: 0x3F80,  # exactly half way, kept bit even: down
        1 + 2**-7 + 2**-8: 0x3F82,  # half way, kept bit odd: up
        1 + 2**-8 + 2**-23: 0x3F81,  # just past half way: up
        -2.0: 0xC000,
        np.inf: 0x7F80,
        3.4028235e38: 0x7F80,  # the largest float32 rounds up to infinity
        np.nan: 0x7FC0,
    }
    x = np.array(list(cases), dtype=np.float32)
    np.testing.assert_array_equal(float32_to_bfloat16(x), np.array(list(cases.values()), dtype=np.uint16))


def test_bfloat16_encoding_matches_torch():
    torch = pytest.importorskip("torch", reason="torch's bfloat16 cast is the reference rounding")
    rng = np.random.default_rng(1)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-40, 3.4028235e38, -3.4e38]
    x = np.concatenate([
        rng.standard_normal(10_000, dtype=np.float32),
        rng.integers(0, 2**32, 10_000, dtype=np.uint32).view(np.float32),  # every bit pattern
        np.array(specials, dtype=np.float32),
    ])
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    ours = float32_to_bfloat16(x)
    nan = np.isnan(x)  # torch's NaN bits vary with its code path; any NaN must stay a NaN
    np.testing.assert_array_equal(ours[~nan], expected[~nan])
    assert np.isnan(bfloat16_to_float32(ours[nan])).all() and nan.sum() > 10


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reads_files_the_official_writer_wrote(tmp_path, dtype):
    # C order: safetensors 0.8's numpy writer stores a Fortran-ordered array's bytes as if C-ordered
    tensors = {name: np.ascontiguousarray(value, dtype=dtype) for name, value in sample_tensors().items()}
    safetensors_numpy.save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "np"})
    loaded = read_safetensors(tmp_path / "t.safetensors")
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value.astype(np.float32), strict=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_official_reader_reads_files_we_wrote(tmp_path, dtype):
    tensors = sample_tensors()
    write_safetensors(tmp_path / "t.safetensors", tensors, dtype, metadata={"format": "pt"})
    loaded = safetensors_numpy.load_file(tmp_path / "t.safetensors")
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value.astype(dtype), strict=True)
    header_length = int.from_bytes((tmp_path / "t.safetensors").read_bytes()[:8], "little")
    assert header_length % 8 == 0  # padded as the official writer pads


def test_official_torch_reader_reads_our_bfloat16(tmp_path):
    torch = pytest.importorskip("torch", reason="numpy has no bfloat16; safetensors reads BF16 through torch")
    from safetensors.torch import load_file, save_file

    tensors = sample_tensors()
    write_safetensors(tmp_path / "ours.safetensors", tensors, "bfloat16")
    loaded = load_file(tmp_path / "ours.safetensors")
    save_file({k: torch.from_numpy(v.copy()).to(torch.bfloat16) for k, v in tensors.items()},
              tmp_path / "theirs.safetensors")
    theirs = read_safetensors(tmp_path / "theirs.safetensors")
    for name, value in tensors.items():
        assert loaded[name].dtype == torch.bfloat16
        np.testing.assert_array_equal(loaded[name].float().numpy(), bfloat16_rounded(value), strict=True)
        np.testing.assert_array_equal(theirs[name], bfloat16_rounded(value), strict=True)


def test_names_reads_only_the_requested_tensors(tmp_path):
    path = tmp_path / "t.safetensors"
    mask = np.tril(np.ones((6, 6), dtype=np.int64))  # not a float: reading it would be an error
    safetensors_numpy.save_file({"mask": mask, "weight": np.ones((2, 3), np.float32)}, path)
    assert read_header(path)["mask"].dtype == "I64"
    assert read_safetensors(path, ["weight"]).keys() == {"weight"}
    with pytest.raises(CheckpointError, match=r"t\.safetensors: tensor 'mask' has dtype I64, expected float32"):
        read_safetensors(path)
    with pytest.raises(CheckpointError, match="no tensor 'bias'"):
        read_safetensors(path, ["bias"])


def test_header_lists_tensors_without_reading_data(tmp_path):
    write_safetensors(tmp_path / "t.safetensors", sample_tensors(), "float16")
    info = read_header(tmp_path / "t.safetensors")
    assert list(info) == sorted(sample_tensors())  # the official writer's order
    assert info["transposed"].shape == (6, 4) and info["transposed"].dtype == "F16"
    assert info["scalar"].shape == () and info["scalar"].nbytes == 2


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"a": np.ones(3, np.float32)})
    before = path.read_bytes()
    with pytest.raises(ValueError):
        write_safetensors(path, {"a": np.ones(3), "b": np.array(["not a number"])})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.safetensors"]


def test_a_float32_tensor_at_an_offset_not_4_aligned_is_read_right_and_aligned(tmp_path):
    import json
    value = np.arange(5, dtype=np.float32) / 3  # after 3 float16: 6 bytes into the data (the official
    header = json.dumps({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},  # writer puts F32 first)
                         "b": {"dtype": "F32", "shape": [5], "data_offsets": [6, 26]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "mixed.safetensors").write_bytes(len(header).to_bytes(8, "little") + header +
                                                 np.ones(3, "<f2").tobytes() + value.astype("<f4").tobytes())
    assert read_header(tmp_path / "mixed.safetensors")["b"].offset % 4
    got = read_safetensors(tmp_path / "mixed.safetensors")["b"]
    assert got.flags.aligned
    np.testing.assert_array_equal(got, value, strict=True)
