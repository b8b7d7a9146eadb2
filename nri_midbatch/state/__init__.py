"""What the plugin remembers of the pods and containers on the node, with kubelet's own values."""
