"""The top floor: what a person runs. :mod:`~cudaload.commands.cli` (the ``cudaload`` command, one module a
subcommand), :mod:`~cudaload.commands.doctor` (``cudaload.diagnose``), :mod:`~cudaload.commands.demo`,
:mod:`~cudaload.commands.bytecache` (``cudaload.precompile``). Nothing below imports this package."""
