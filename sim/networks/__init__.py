"""Network models at flow level: `electrical` (the max-min flow solver; compiled in
`fillkernel`), `baselines` (each network on it), `fattree`, `sipring`, `topoopt`,
`optinc`, `sharing` and `congestion` (how jobs share a link; its tick compiled in
`lawkernel`), `profile` (a job's demand on its links) and `search` (the best hybrid split
on a network). Imports `sim.clock` and the control plane, never `sim.devices` or
`sim.backend`."""
