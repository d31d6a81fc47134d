"""``just soak``: a long chaos run that watches the processes' resources.

One scenario generated in code (:mod:`tools.soak.plan`): the chaos workload at a fixed rate
(half of what the latest ``just bench`` measured for single submits, or ``--rate``), mixed
job types with fenced effects, and a fault of the harness's random mix every minute,
sometimes two overlapping. :func:`chaos.runner.run_scenario` runs it as any scenario (load,
faults, quiet, tables, checker, its report), while :mod:`tools.soak.sampler` reads every
process's RSS, open descriptors and Postgres connections once a minute. :mod:`tools.soak.goals`
judges the samples and the jobs' scheduling delays (pure); :mod:`tools.soak.report` writes
``reports/soak/<UTC time>/``: ``report.md``, ``report.json`` and ``soak.svg``, next to the
chaos run's own report in a subdirectory.
"""
