"""``python -m tinax.explore``: the ``tinax`` command (see ``tinax._cli.main``)."""

from tinax._cli.entry import console

console(prog="python -m tinax.explore")
