"""The threshold study's presets, one file each (added to every driver's `--preset`)."""
