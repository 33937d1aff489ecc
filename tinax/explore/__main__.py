"""``python -m tinax.explore``: see ``tinax.explore._cli``."""

import os
import sys

from tinax.explore._cli import main

try:
    status = main()
    sys.stdout.flush()
except BrokenPipeError:
    # The reader (``| head``) has stopped reading: nothing more to say.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 0
sys.exit(status)
