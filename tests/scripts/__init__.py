"""Tests of the tooling under scripts/: the installer, the device packs."""
