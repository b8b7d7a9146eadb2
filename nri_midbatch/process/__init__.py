"""The plugin as a process: composition, configuration watch, recording, heap."""
