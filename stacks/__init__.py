"""CDK (Python) infrastructure: stacks are deployment units, ``stacks/components`` holds the logical pieces.

Entry point: ``app.py`` reads context once into :class:`stacks.config.InfraConfig` and calls
:func:`stacks.app_factory.build_stacks`.
"""
