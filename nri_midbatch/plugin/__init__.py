"""The NRI plugin: handlers, the Synchronize pass, the codec, deferred work, cgroup writes."""
