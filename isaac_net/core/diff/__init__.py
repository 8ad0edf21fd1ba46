"""Differentiable network models: L1D and QAD (``DiffFluid``) and their rollouts.

Exploratory research infrastructure, not an engine level: ``make_engine`` does not build
it and the engine levels do not depend on it.
"""

from isaac_net.core.diff.model import DiffFluid
from isaac_net.core.diff.relax import relaxed_bernoulli
from isaac_net.core.diff.rollout import rollout

__all__ = ["DiffFluid", "rollout", "relaxed_bernoulli"]
