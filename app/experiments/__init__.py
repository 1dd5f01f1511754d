"""Experiments: the runner (every network of an experiment on the same jobs, through the
service's orchestration), run directories and their results store, sweeps (process pool
or Dask), figures and link studies. The application layer: it reaches a back end only
through `oddl.app.registry`."""
