"""`minigpt.load`: from a name to a runnable model. Composes checkpoint + tokenizer + model.

A source is one of:
- a local directory in Hugging Face layout (config.json, model.safetensors or a sharded index,
  and usually vocab.json + merges.txt);
- an alias (`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`, `distilgpt2`) or a hub id
  (`openai-community/gpt2`), downloaded once by huggingface_hub into its cache;
- an embedded random model (`random-124m`, `random-tiny`): deterministic weights built in
  memory, so that everything runs with no download at all.
"""

from __future__ import annotations

import difflib
from functools import partial
from pathlib import Path

from .checkpoint import INDEX_FILE, WEIGHTS_FILE, load_checkpoint
from .config import GPT2_SIZES, GPT2Config
from .errors import InputError, ModelNotFoundError, OfflineError
from .kernels import KERNELS
from .model import Model
from .params import random_params
from .tokenizer import gpt2_tokenizer

GPT2_VOCAB_SIZE = 50257  # 50,000 merges + 256 bytes + <|endoftext|>
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


def load(source: str = "gpt2", *, kernels: str = "exact") -> Model:
    """Load a GPT-2 by directory, alias, hub id or embedded name; see the module docstring."""
    if kernels not in KERNELS:
        raise InputError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    source = str(source)
    if source in EMBEDDED:
        config = EMBEDDED[source]
        return Model(config, random_params(config, seed=0), KERNELS[kernels], gpt2_tokenizer)
    directory = resolve_directory(source)
    config, params = load_checkpoint(directory)
    # GPT-2's tokenizer only for GPT-2's vocabulary: a test checkpoint with another runs on ids alone.
    tokenizer = partial(gpt2_tokenizer, directory) if config.vocab_size == GPT2_VOCAB_SIZE else None
    return Model(config, params, KERNELS[kernels], tokenizer)


def resolve_directory(source: str) -> Path:
    """A local checkpoint directory for `source`, downloading from the hub when it names a hub repo."""
    path = Path(source).expanduser()
    if source and path.is_dir():  # Path("") is the current directory: never meant
        return path
    if source and path.exists():
        raise ModelNotFoundError(f"{source} is a file; --model wants a checkpoint directory")
    looks_like_path = (source.startswith((".", "/", "~")) or "\\" in source or source.count("/") > 1
                       or path.parent.is_dir() and path.parent != Path("."))  # e.g. weights/gpt2, weights/ existing
    if source in HUB_ALIASES or (source.count("/") == 1 and not looks_like_path):
        return download(HUB_ALIASES.get(source, source))
    raise unknown_source(f"no directory {source!r} and no model of that name", source)


def unknown_source(problem: str, source: str) -> ModelNotFoundError:
    """The error for a source that names nothing minigpt can load, suggesting the nearest known name."""
    close = difflib.get_close_matches(source.lower(), known_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ModelNotFoundError(
        f"{problem}; {hint}known names: {', '.join(known_names())}; or a hub id such as openai-community/gpt2"
    )


def download(repo_id: str) -> Path:
    """The hub repo's checkpoint files, from huggingface_hub's cache or downloaded (with its progress bar).

    huggingface_hub writes each file under a temporary name (blobs/*.incomplete) and links it into
    the snapshot only when complete, so an interrupted download never leaves a partial file where
    minigpt looks; the next call resumes it. It honours HF_HUB_OFFLINE=1 and HF_HOME.
    """
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
    if not any((snapshot / name).is_file() for name in (WEIGHTS_FILE, INDEX_FILE)):
        raise OfflineError(
            f"the copy of {repo_id!r} in the huggingface_hub cache ({snapshot}) has no {WEIGHTS_FILE}: its download "
            "was cut off, or the repository has no safetensors weights; run again online to resume it"
        )
    return snapshot
