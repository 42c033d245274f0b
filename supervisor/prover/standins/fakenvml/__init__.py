"""A stand-in of nvidia-ml-py's ``pynvml`` (in ``pynvml.py`` beside this file).

Put this directory first on ``PYTHONPATH`` and ``import pynvml`` gets the stand-in: GPUs
that exist only in a JSON control file, NVML calls that hang or fail on cue. It is a
package so that setuptools installs ``pynvml.py`` with the rest, and so that the demo
(prover/demo.py) can ask it where it lies; the stand-in ``pynvml`` itself is only ever imported
as ``pynvml``, from that directory on the path.
"""

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent  # what goes first on PYTHONPATH
