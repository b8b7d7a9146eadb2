"""The NRI plugin: handlers, the Synchronize pass, the codec, work after replies, cgroup writes."""
