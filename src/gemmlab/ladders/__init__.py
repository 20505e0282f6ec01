"""The ladders' registrations. Importing this package fills ``gemmlab.registry``."""

from . import hopper, sgemm  # noqa: F401
