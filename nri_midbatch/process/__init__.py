"""The plugin as a process: composition (the recorder too), configuration watch, heap."""
