"""kvsim: a discrete-event capacity-planning simulator for LLM serving.

The distribution installs one import package, `kvsim`, whose subpackages are the repository's
top-level folders (pyproject.toml maps `kvsim.simcore` to simcore/, `kvsim.cli` to cli/, ...); this
file is `kvsim/__init__.py` and lives here so the checkout keeps its layout. Kept empty of imports:
every `kvsim` command starts here.
"""

__version__ = "0.2.0"
