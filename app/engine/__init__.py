"""The workers' engine, in the shape of vLLM v1's: the scheduler (`scheduler`:
admission, preemption, fair shares and when to claim; no I/O), the core
(`core.Generation`: the step loop that drives the scheduler and the model
runner, app.runtime.decode), the output processor (`outflow`: text, logprobs and
pieces as each step emits them), the loop's own state, lock and hand-over
(`loop`), and the job-store port the core claims, records and finishes through
(`store`). Beside the core, the sync lane's server (`lane_server`): the other
runtime a worker child runs. The doors never import it; a worker reaches it
through `container.worker` (app.worker_runtime)."""
