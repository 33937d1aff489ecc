"""``python -m tinax.explore PATH [--leaf CHECKPOINTABLE KEY] [--json]``."""

import sys

from tinax.explore._cli import main

sys.exit(main())
