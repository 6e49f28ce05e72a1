"""Tensor parallel on the engine floor: rank 0 (the server's process) broadcasts each step's
inputs to the other ranks, which run the same forward on their shards (models/parallel/).

- `step_channel.py`: the one broadcast per step (engine/step_inputs.py packs it) and the
  stop message;
- `rank.py`: a runner's place in the group, and rank 0's lifetime of it (watch, close);
- `cluster.py`: which machines (nodes) hold which ranks, from flags or torchrun's variables;
- `membership.py`: the rendezvous store: rank 0's config for all, who joined, heartbeats, stops;
- `liveness.py`: one TCP connection per rank to rank 0, whose close says the rank's process ended;
- `workers.py`: rank 0 starts, watches and stops the other ranks' processes;
- `worker_main.py`: a rank > 0's loop and process (`python -m engine.parallel.worker_main`);
- `follower.py`: a machine without rank 0 (`tgserve serve --node-rank R`, R > 0).

Any rank's runner is built from the one set of model files by `runner_factory.build_runner`.
"""
