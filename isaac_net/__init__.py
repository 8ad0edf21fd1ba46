"""isaac_net: differentiable models of a robot fleet's 5G uplink, checked against discrete levels."""

__version__ = "0.1.0"
