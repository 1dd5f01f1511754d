"""Experiments: `runner` (every network of an experiment on the same jobs, through the
service's orchestration), `outcome` (what a run reports), `results` (run directories and
their store), `sweep` (a process pool or Dask), `figures` (drawn beside a run by
`plotter`'s helper), `link_study`, `remote` (a job run by a testbed's arbiter) and
`estimate` (what a run will cost, said before it starts). It reaches a back end only
through `oddl.app.registry`."""
