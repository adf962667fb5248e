"""A vendor's conformance test: octavo's kit against the platform octavo resolves.

Run it with the plugin installed: ``pytest vendor_conformance.py``. The kit's model fixture uses
``OCTAVO_DEFAULT_MODEL`` when set, else writes a tiny random checkpoint.
"""

from octavo.testing.platform_conformance import PlatformConformance


class TestDummyPlatformConformance(PlatformConformance):
    platform = None  # whatever octavo resolves: the installed plugin, with no env var set
