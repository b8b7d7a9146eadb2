"""NRI to policy and back: views, remembered workloads, replies, cgroup writes."""
