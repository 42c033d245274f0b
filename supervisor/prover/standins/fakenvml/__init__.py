"""A stand-in of nvidia-ml-py's ``pynvml`` (in ``pynvml.py`` beside this file).

Put this directory first on ``PYTHONPATH`` and ``import pynvml`` gets the stand-in: GPUs
that exist only in a JSON control file, NVML calls that hang or fail on cue. It is a
package only so that setuptools installs ``pynvml.py`` with the rest; nothing imports it
as ``supervisor.prover.standins.fakenvml``.
"""

from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent  # what goes first on PYTHONPATH
