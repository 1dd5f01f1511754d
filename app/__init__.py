"""The application: what people use, above the back ends (it reaches them only through
`registry`, but for the CLI commands that are a back end's own, `emulate` and `lightning`).

- `cli/`: the `oddl` command line, a thin layer over `api`;
- `api`: the public API (the one writer of a run directory);
- `session`: what a run needs of its testbed (a private emulator, the lock, an announcer);
- `registry`: the one place a back end is chosen, and the table of what each one is;
- `experiments/`: the runner, run directories, sweeps, figures, link studies, estimates;
- `queue`: the arbiter as a service (`oddl arbiter`), `requests`, what a request to it
  carries, `operators`, an operator's requests to it, `records`, what it recorded of
  jobs as its clients read it, `requeue`, a job queued again with its iterations kept,
  `arrays`, job arrays, `preempt`, a preempting class's jobs stopping others', `amend`, a
  job's time limit changed, `notices`, each job's end kept on the bus a while and told to
  its webhook, `dependencies`, what a queued job waits for besides nodes,
  `arbiter_view`, what these parts see of the service (none imports the queue), `ledger`, its
  durable state, `orders`, what its operators ordered (drains, users, windows),
  `limits`, its fairness rules, `priority`, its queue's order (base, age, fair share),
  `users`, its users and their tokens, `submission`, a job as submitted, and
  `job_runs`, each submitted job's run directory;
- `dashboard`: the testbed's live page (and `web/`, its assets);
- `accept`: the acceptance runner (the checks are `oddl.acceptance`);
- `replay`: a command recorded on a cassette, run again from it (`oddl replay`);
- `stores`: how oddl's SQLite files are opened, each with its schema's version;
- `collector`: the garbage collector tuned for a run's long-lived models;
- `examples`: the shipped testbeds and experiments (`oddl examples DIR`).
"""
