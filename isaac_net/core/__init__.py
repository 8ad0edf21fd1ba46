"""Core: cell constants, radio model, discrete engine levels."""

from isaac_net.core.config import CellConfig
from isaac_net.core.levels import KPI_KEYS, LEVELS, L2LegacyConfig, make_engine

__all__ = ["CellConfig", "KPI_KEYS", "L2LegacyConfig", "LEVELS", "make_engine"]
