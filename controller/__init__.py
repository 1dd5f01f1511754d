"""The oddl control plane: configs, stage-1 arbiter, stage-2 control units, experiments."""

__version__ = "0.1.0"
