"""Test kits octavo ships for the people who extend it (``platform_conformance``)."""
