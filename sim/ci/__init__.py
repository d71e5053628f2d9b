"""Continuous-integration tooling: `kvsim check` (expectations), `kvsim fuzz`, `kvsim shrink`.

* `sim.ci.check`: run scenarios and compare their violations with each scenario's `expect:`;
* `sim.ci.junit`: JUnit XML and GitHub Actions annotations for those outcomes;
* `sim.ci.fuzz`: random valid workloads and cache configurations, seeded, looking for violations;
* `sim.ci.shrink`: delta debugging of a violating scenario down to a minimal inline reproducer;
* `sim.ci.cli`: the typer commands (`register(app)`).
"""
