"""`python -m minigpt COMMAND ...`: the command line, minigpt/cli."""

import signal
import sys

from .cli import main

if callable(signal.getsignal(signal.SIGINT)):  # not SIG_IGN (a background job) nor SIG_DFL
    signal.signal(signal.SIGINT, signal.default_int_handler)  # loaded: Ctrl-C is KeyboardInterrupt again
sys.exit(main())
