"""``python -m tinax.explore``: the ``tinax`` command (see ``tinax._cli.main``)."""

from tinax._cli.entry import MODULE_PROG, console

console(prog=MODULE_PROG)
