"""``python -m tinax.explore``: the ``tinax`` command (see ``tinax.explore._cli.main``)."""

from tinax.explore._cli.main import console

console(prog="python -m tinax.explore")
