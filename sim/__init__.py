"""Everything emulated: virtual clock, optical fabric, device models, baseline networks."""
