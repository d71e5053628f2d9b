"""Continuous-integration tooling: `kvsim check` (expectations), `kvsim fuzz`, `kvsim shrink`.

* `sim.ci.check`: run scenarios and compare their violations with each scenario's `expect:`;
* `sim.ci.outcome`: one scenario's outcome and its text and JSON forms;
* `sim.ci.junit`: JUnit XML and GitHub Actions annotations for those outcomes;
* `sim.ci.scenario_yaml`: generated scenarios written with every default that may change;
* `sim.ci.fuzz`: random valid workloads and cache configurations, seeded, looking for violations;
* `sim.ci.shrink`: delta debugging of a violating scenario down to a minimal inline reproducer
  (`ddmin`: the generic searches; `shrink_candidate`: a candidate and its oracle;
  `shrink_phases`: the phases);
* `sim.cli.ci`: the typer commands (`register(app)`).
"""
