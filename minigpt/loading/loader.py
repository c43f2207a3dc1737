"""`minigpt.load`: from a name to a runnable model. Composes checkpoint + tokenizer + model.

A source is a local directory in Hugging Face layout, an alias (`gpt2`) or hub id downloaded once
into huggingface_hub's cache, or an embedded random model (`random-tiny`) built in memory; an
existing local directory always wins (docs/loading.md).
"""

from __future__ import annotations

import difflib
import os
import reprlib
from functools import partial
from pathlib import Path

from .checkpoint import INDEX_FILE, WEIGHTS_FILE, load_checkpoint
from ..gpt2.config import GPT2_SIZES, GPT2_VOCAB_SIZE, GPT2Config
from ..errors import CheckpointError, InputError, ModelNotFoundError, OfflineError
from .files import is_file, kind
from ..exact.kernels import KERNELS
from .model import Model
from .tokenizer import gpt2_tokenizer
from .weights import random_params

HUB_ALIASES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
EMBEDDED = {
    "random-124m": GPT2_SIZES["gpt2"],
    "random-tiny": GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256),
}
# Only what minigpt reads: never the pickled or TensorFlow/Flax weights the hub repos also hold.
HUB_FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
             "vocab.json", "merges.txt"]


def known_names() -> list[str]:
    return [*HUB_ALIASES, *EMBEDDED]


def load(source: str | os.PathLike = "gpt2", *, kernels: str = "exact") -> Model:
    """Load a GPT-2 by directory, alias, hub id or embedded name (a local directory first); see the
    module docstring."""
    if not isinstance(kernels, str) or kernels not in KERNELS:
        raise InputError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):  # None, 123, b"..." are not names: never turned into strings
        raise InputError(f"the model source must be a str or os.PathLike (a directory, alias, hub id or embedded "
                         f"name), got {type(source).__name__} {reprlib.repr(source)}")
    directory = local_directory(source)
    if directory is None and source in EMBEDDED:
        config = EMBEDDED[source]
        return Model(config, random_params(config, seed=0), KERNELS[kernels], gpt2_tokenizer)
    directory = directory or hub_directory(source)
    config, params = load_checkpoint(directory)
    # GPT-2's tokenizer only for GPT-2's vocabulary: a test checkpoint with another runs on ids alone.
    tokenizer = partial(gpt2_tokenizer, directory) if config.vocab_size == GPT2_VOCAB_SIZE else None
    return Model(config, params, KERNELS[kernels], tokenizer)


def local_directory(source: str) -> Path | None:
    """`source` as an existing local directory; None when nothing is there; anything else there is an error."""
    path = as_path(source)
    what = kind(path, CheckpointError) if source else None  # Path("") is the current directory: never meant
    if what == "a directory":
        return path
    if what is not None:
        raise ModelNotFoundError(f"{source} is {what}, not a checkpoint directory")
    return None


def hub_directory(source: str) -> Path:
    """The checkpoint directory of a source that is no local directory: downloaded when it names a hub repo."""
    path = as_path(source)
    looks_like_path = (source.startswith((".", "/", "~")) or "\\" in source or source.count("/") > 1
                       or path.parent != Path(".") and kind(path.parent, CheckpointError) == "a directory")
    if source in HUB_ALIASES or (source.count("/") == 1 and not looks_like_path):
        return download(HUB_ALIASES.get(source, source))
    raise unknown_source(f"no directory {source!r} and no model of that name", source)


def as_path(source: str) -> Path:
    """`source` as a path, ~ expanded; an unknown ~user stays as written (Path.expanduser would raise)."""
    return Path(os.path.expanduser(source))


def unknown_source(problem: str, source: str) -> ModelNotFoundError:
    """The error for a source that names nothing minigpt can load, suggesting the nearest known name."""
    close = difflib.get_close_matches(source.lower(), known_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ModelNotFoundError(
        f"{problem}; {hint}known names: {', '.join(known_names())}; or a hub id such as openai-community/gpt2"
    )


def download(repo_id: str) -> Path:
    """The hub repo's checkpoint files, from huggingface_hub's cache or downloaded; an interrupted
    download leaves no partial file where minigpt looks (huggingface_hub links a file in once whole)."""
    import huggingface_hub
    from huggingface_hub.errors import (GatedRepoError, HFValidationError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        snapshot = Path(huggingface_hub.snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except HFValidationError:
        raise unknown_source(f"{repo_id!r} is neither a directory nor a valid hub id", repo_id) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
        raise ModelNotFoundError(
            f"the Hugging Face Hub has no accessible model {repo_id!r}; known aliases: {', '.join(HUB_ALIASES)}"
        ) from None
    except LocalEntryNotFoundError as e:
        raise OfflineError(
            f"cannot download {repo_id!r}: offline (HF_HUB_OFFLINE set or the Hub unreachable) and it is not "
            f"(completely) in the local cache ({type(e).__name__}); pass a local checkpoint directory, or "
            "random-124m to run with no download"
        ) from None
    except Exception as e:  # cut off mid-download: huggingface_hub re-raises its HTTP client's errors
        raise OfflineError(
            f"downloading {repo_id!r} failed ({type(e).__name__}: {e}); no partial file is ever loaded: "
            "run again to resume, or pass a local checkpoint directory"
        ) from None
    if not any(is_file(snapshot / name, OfflineError) for name in (WEIGHTS_FILE, INDEX_FILE)):
        raise OfflineError(
            f"the copy of {repo_id!r} in the huggingface_hub cache ({snapshot}) has no {WEIGHTS_FILE}: its download "
            "was cut off, or the repository has no safetensors weights; run again online to resume it"
        )
    return snapshot
