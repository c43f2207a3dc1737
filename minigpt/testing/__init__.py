"""Part 11: testing. The book's claims as tools a reader runs against their own code: Hypothesis
strategies for random GPT-2s and requests, the bit oracle, and the properties that make a kernel
set, a drafter and the engine exact (docs/testing.md). Needs Hypothesis (the `testing` extra);
`import minigpt` does not.

    from minigpt.testing import check_kernels
    check_kernels(my_kernels)      # quiet if exact; else an AssertionError with the falsifying example

Modules, in reading order:
    strategies  random GPT-2s (in memory, or as Hugging Face checkpoints), prompts, requests' options
    bits        assert_bitwise: the same bits, or the first difference named
    kernels     check_kernels: a row's bits depend on that row alone
    drafters    check_drafter: the drafter contract, as properties
    machine     EngineMachine: the engine as a Hypothesis state machine, its pages and jobs checked after every rule
"""

try:
    import hypothesis  # noqa: F401 (the one dependency of this part)
except ImportError as e:  # pragma: no cover (the extra is installed wherever the tests run)
    raise ImportError("minigpt.testing needs Hypothesis: pip install 'minigpt[testing]'") from e

from .bits import assert_bitwise
from .kernels import check_kernels
from .drafters import check_drafter
from .machine import EngineMachine

__all__ = ["assert_bitwise", "check_kernels", "check_drafter", "EngineMachine"]
