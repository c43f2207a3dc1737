"""`python -m minigpt COMMAND ...`: the command line, minigpt/cli."""

import os
import signal
import sys

if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # Ctrl-C while the modules below load exits 130 at once, with no traceback (nothing is printed yet)
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from .cli import main  # noqa: E402

if callable(signal.getsignal(signal.SIGINT)):  # not SIG_IGN (a background job) nor SIG_DFL
    signal.signal(signal.SIGINT, signal.default_int_handler)  # loaded: Ctrl-C is KeyboardInterrupt again
sys.exit(main())
