"""``python -m tinax.explore``: the ``tinax`` command (see ``tinax.explore._cli``)."""

from tinax.explore._cli import console

console(prog="python -m tinax.explore")
