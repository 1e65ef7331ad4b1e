"""Build runwatch's compiled kernels: every ``runwatch/**/*.pyx`` becomes a C extension.

Everything else about the package is in ``pyproject.toml``. The kernels are the replay's
hot loops, written once in Cython and used by live detection and replay alike. Floats must
come out as the Python code would compute them (``tests`` compare with it), so the C
compiler may not fuse a multiply and an add (``-ffp-contract=off``) nor reorder float
arithmetic (no ``-ffast-math``).
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]

extensions = [
    Extension(".".join(p.with_suffix("").parts), [str(p)], extra_compile_args=FLAGS)
    for p in sorted(Path("runwatch").rglob("*.pyx"))
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}))
