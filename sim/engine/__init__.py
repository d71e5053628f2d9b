"""The only SimPy package: the simulated clock, replicas, their step loop, arrivals, sessions and a run.

* `engine`: `Engine`, one or more co-located replicas behind a router;
* `replica`: one replica (scheduler, KV manager, step-time model) and its state;
* `arrivals`: requests entering at their arrival times; `sessions`: closed-loop session turns;
* `client`: a benchmark client's cap on requests in flight, and per-token times;
* `step_loop`: the replica step loop both engines run (`ReplicaStepLoop`, its `StepHooks`);
* `disagg`: prefill and decode pools in one environment, linked by a KV transfer;
* `run`: a scenario file in, a `RunResult` out (`sim.run`).
"""
