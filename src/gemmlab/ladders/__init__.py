"""The ladders' steps, one module per ladder; each registers its steps in ``gemmlab.registry`` when
imported (``registry.LADDER_MODULES`` names them; the registry imports them on first use)."""
