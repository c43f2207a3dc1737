"""The path a reader follows from a public call to GPT-2's first block: the functions and modules of
minigpt entered before it, and the call stack there (issue 45's measure of the book's weight).

    PYTHONPATH=. python scripts/call_path.py

Prints, for `minigpt.generate(model, ids, 2)` and for `Engine.generate` on two prompts: how many
distinct functions and modules are entered before the first call of gpt2.layers.block, the stack
at that call, and the modules the stack comes back to after leaving them.
"""

from __future__ import annotations

import sys

import minigpt


GENERATED = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>", "__create_fn__")  # not a reader's


class FirstBlock(BaseException):
    """Raised at the first block to stop the run there (no handler of minigpt's catches it)."""


def path_to_first_block(call) -> tuple[list[str], list[str]]:
    """(the distinct minigpt functions entered before the first block, in order; the stack there).
    Comprehensions, lambdas and dataclasses' generated methods are not counted: a reader reads their
    lines in the function that holds them."""
    seen: dict[str, None] = {}
    stack: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("minigpt"):
            return
        name = f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname}"
        if name == "minigpt.gpt2.layers.block":
            f, found = frame, []
            while f is not None:
                if f.f_globals.get("__name__", "").startswith("minigpt"):
                    found.append(f"{f.f_globals['__name__']}.{f.f_code.co_qualname}")
                f = f.f_back
            stack[:] = found[::-1]
            sys.setprofile(None)  # the clean-up the run does on its way out is not on the path
            raise FirstBlock
        if not any(generated in name for generated in GENERATED):
            seen.setdefault(name, None)

    sys.setprofile(profile)
    try:
        call()
    except FirstBlock:
        pass
    finally:
        sys.setprofile(None)
    return list(seen), stack


def returns(stack: list[str]) -> list[str]:
    """The modules the stack comes back to after leaving them."""
    left, back, last = set(), [], None
    for name in stack:
        module = module_of(name)
        if module != last and module in left:
            back.append(module)
        if last is not None and module != last:
            left.add(last)
        last = module
    return back


def module_of(qualified: str) -> str:
    """The module of 'package.module.Class.function' (the minigpt module the function is defined in)."""
    parts = qualified.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in sys.modules:
            return ".".join(parts[:i])
    return qualified


def report(title: str, call) -> None:
    call()  # once before: what loads on first use (the tokenizer's tables) is not on the path
    functions, stack = path_to_first_block(call)
    modules = {module_of(f) for f in functions}
    print(f"{title}: {len(functions)} functions in {len(modules)} modules before the first block")
    print("  functions: " + ", ".join(name.removeprefix("minigpt.") for name in functions))
    print("  stack: " + " > ".join(name.removeprefix("minigpt.") for name in stack))
    print(f"  the stack comes back to: {returns(stack) or 'no module it left'}")


def main() -> None:
    model = minigpt.load("random-tiny")
    report("generate", lambda: minigpt.generate(model, [464, 3290], 2))
    engine = minigpt.Engine(model)
    report("Engine.generate", lambda: engine.generate([[464, 3290], [7454, 2402]], 2))


if __name__ == "__main__":
    main()
